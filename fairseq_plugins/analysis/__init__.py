"""The suite's analysis library: fairseq-generate output, BLEU by length / No-UNK, alignments, curves, scores."""
