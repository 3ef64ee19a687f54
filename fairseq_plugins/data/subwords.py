"""Moses tokenization (sacremoses) and subword models (subword-nmt joint BPE, sentencepiece)
for corpora built in Python, writing one sentence per line."""
import os
from typing import Dict, List, Sequence


def moses_tokenize(lines: Sequence[str], lang: str) -> List[str]:
    """normalize-punctuation.perl then ``tokenizer.perl -a -l LANG -no-escape``, in Python."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    normalizer, tokenizer = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
    return [" ".join(tokenizer.tokenize(normalizer.normalize(line), aggressive_dash_splits=True,
                                        return_str=True, escape=False).split()) for line in lines]


def learn_apply_bpe(train: Sequence[str], texts: Dict[str, List[str]], merges: int, codes_path: str) -> Dict[str, List[str]]:
    """Joint BPE learned on ``train`` (both sides' lines), applied to every text (``@@`` marks
    a split word, as ``fairseq-generate --remove-bpe`` expects)."""
    from subword_nmt.apply_bpe import BPE
    from subword_nmt.learn_bpe import learn_bpe

    with open(codes_path + ".part", "w", encoding="utf-8") as codes:
        learn_bpe(list(line + "\n" for line in train), codes, merges, min_frequency=2, is_dict=False)
    os.replace(codes_path + ".part", codes_path)
    with open(codes_path, encoding="utf-8") as codes:
        bpe = BPE(codes)
    return {name: [bpe.process_line(line) for line in lines] for name, lines in texts.items()}


def learn_apply_sentencepiece(train: Sequence[str], texts: Dict[str, List[str]], vocab_size: int,
                              model_prefix: str) -> Dict[str, List[str]]:
    """A joint unigram sentencepiece model learned on ``train`` (raw text), applied to every
    text as pieces (``fairseq-generate --remove-bpe sentencepiece`` undoes it)."""
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(train), model_prefix=model_prefix, vocab_size=vocab_size,
        character_coverage=1.0, model_type="unigram", num_threads=1,
        hard_vocab_limit=False, minloglevel=2,  # a small corpus may not support the full vocabulary
    )
    sp = spm.SentencePieceProcessor(model_file=model_prefix + ".model")
    return {name: [" ".join(sp.encode(line, out_type=str)) for line in lines] for name, lines in texts.items()}


def write_lines(path: str, lines: Sequence[str]) -> None:
    """Whole file or nothing: written to PATH.part, then renamed."""
    with open(path + ".part", "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)
    os.replace(path + ".part", path)
