"""BLEU and chrF by source-sentence length, one line per system (Bahdanau et al. 2015, Fig. 2).

    fairseq-plugins-bleu-by-length --gen RNNsearch-50=gen50.txt --gen RNNencdec-50=genenc.txt \\
        --out length

The computation is in :mod:`fairseq_plugins.analysis.bleu_by_length`.
"""
from fairseq_plugins.analysis import bleu_by_length
from fairseq_plugins.cli import common


def get_parser():
    parser = common.ArgumentParser(prog="fairseq-plugins-bleu-by-length", description=__doc__.split("\n")[0])
    common.add_system_args(parser, src_help="plain source file (with --hyp): gives the sentence lengths")
    parser.add_argument("--buckets", metavar="E0,E1,...",
                        help="bucket edges; bucket a-b holds a <= length < b, the last is open, sentences "
                        f"shorter than the first edge are left out (Bahdanau et al.'s: {bleu_by_length.PAPER_EDGES}; "
                        "default: equal-count sixths of the sources' lengths, thirds under "
                        f"{6 * bleu_by_length.SIXTH} sentences, labelled a-b with b included)")
    parser.add_argument("--tokenize", default="13a",
                        help="sacrebleu tokenizer for BLEU (13a, intl, none, ...; default 13a)")
    common.add_out_arg(parser, "bleu_by_length")
    return parser


def main(argv=None):
    common.cli_main(get_parser, bleu_by_length.run, argv)


if __name__ == "__main__":
    main()
