"""Moses-style text preparation in Python (sacremoses): no Perl, no mosesdecoder checkout.

Sub-commands (each reads and writes UTF-8, one sentence per line):

* ``tokenize -l LANG``: the pipeline of fairseq's ``prepare-wmt14*.sh`` —
  remove-non-printing-char.perl, normalize-punctuation.perl, then
  ``tokenizer.perl -a -l LANG`` (aggressive hyphen splitting, Moses escaping);
* ``detokenize -l LANG``: ``detokenizer.perl`` (un-escapes), e.g. before SacreBLEU;
* ``clean``: ``clean-corpus-n.perl`` — drops the pairs whose token counts fall outside
  ``[--min-len, --max-len]`` or whose length ratio exceeds ``--ratio``, keeping the two
  sides aligned and reporting how many pairs each rule dropped;
* ``spm-train`` / ``spm-encode``: a joint sentencepiece model, in place of BPE.

Line policy, shared by every sub-command, so that the two sides of a corpus stay aligned:

* lines are split on ``\\n`` only; a trailing ``\\r`` (CRLF files) is removed and counted;
  any other control character (``\\p{C}``, including a lone ``\\r`` that later tools would
  read as a line break) becomes a space, as remove-non-printing-char.perl does;
* bytes that are not UTF-8 are replaced by U+FFFD and the line is counted: ``tokenize``
  keeps the line (a per-language tool must not change the line count) and ``clean``
  drops every pair with U+FFFD on either side, counted as ``invalid UTF-8``.

The counts go to stderr as one summary line per file.
"""
import argparse
import functools
import itertools
import multiprocessing
import os
import sys
from collections import Counter

import regex

NON_PRINTING = regex.compile(r"\p{C}")
REPLACEMENT_CHAR = "\ufffd"


def decode_line(raw, counts):
    """bytes of one line (with or without its newline) -> text, updating ``counts``."""
    raw = raw.rstrip(b"\n")
    if raw.endswith(b"\r"):
        counts["crlf"] += 1
        raw = raw[:-1]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        counts["invalid_utf8"] += 1
        text = raw.decode("utf-8", errors="replace")
    return NON_PRINTING.sub(" ", text)


def open_in(path):
    return sys.stdin.buffer if path == "-" else open(path, "rb")


class AtomicOutput:
    """Write to PATH.part and rename it to PATH only when the whole command succeeded."""

    def __init__(self, path):
        self.path = path
        self.part = None if path == "-" else path + ".part"

    def __enter__(self):
        self.handle = sys.stdout.buffer if self.part is None else open(self.part, "wb")
        return self.handle

    def __exit__(self, exc_type, exc, tb):
        if self.part is None:
            self.handle.flush()
            return
        self.handle.close()
        if exc_type is None:
            os.replace(self.part, self.path)
        else:
            os.remove(self.part)


def report(command, name, counts):
    print(
        f"{command}: {name}: {counts['lines']} lines; {counts['crlf']} CRLF endings removed; "
        f"{counts['invalid_utf8']} with invalid UTF-8 (bytes replaced by U+FFFD)",
        file=sys.stderr,
    )


# ---------------------------------------------------------------- tokenize / detokenize

_worker = {}


def _init_moses(mode, lang, normalize, aggressive, escape):
    from sacremoses import MosesDetokenizer, MosesPunctNormalizer, MosesTokenizer

    _worker.update(mode=mode, aggressive=aggressive, escape=escape)
    if mode == "tokenize":
        _worker["normalizer"] = MosesPunctNormalizer(lang=lang) if normalize else None
        _worker["tokenizer"] = MosesTokenizer(lang=lang)
    else:
        _worker["detokenizer"] = MosesDetokenizer(lang=lang)


def _moses_line(raw):
    """One raw line -> (processed text, Counter of policy events). Runs in the workers."""
    counts = Counter()
    text = decode_line(raw, counts)
    if _worker["mode"] == "tokenize":
        if _worker["normalizer"] is not None:
            text = _worker["normalizer"].normalize(text)
        text = _worker["tokenizer"].tokenize(
            text, aggressive_dash_splits=_worker["aggressive"], return_str=True, escape=_worker["escape"]
        )
    else:
        text = _worker["detokenizer"].detokenize(text.split(), unescape=_worker["escape"])
    # Collapse every Unicode space (U+2028, U+0085, ...) so no later tool sees a line break.
    return " ".join(text.split()), counts


def run_moses(args, mode):
    if mode == "tokenize":
        init = (mode, args.lang, not args.no_normalize, args.aggressive, not args.no_escape)
    else:
        init = (mode, args.lang, False, False, not args.no_escape)
    if args.workers > 1:
        pool = multiprocessing.Pool(args.workers, initializer=_init_moses, initargs=init)
        process = functools.partial(pool.imap, _moses_line, chunksize=2000)
    else:
        _init_moses(*init)
        pool, process = None, functools.partial(map, _moses_line)
    try:
        for path_in, path_out in zip(args.input, args.output):
            counts = Counter(lines=0, crlf=0, invalid_utf8=0)
            with open_in(path_in) as fin, AtomicOutput(path_out) as fout:
                for text, line_counts in process(fin):
                    counts.update(line_counts)
                    counts["lines"] += 1
                    fout.write(text.encode("utf-8") + b"\n")
            report(mode, path_in, counts)
    finally:
        if pool is not None:
            pool.terminate()


# ---------------------------------------------------------------- clean


def count_rest(handle):
    return sum(1 for _ in handle)


def run_clean(args):
    if args.min_len < 1 or args.max_len < args.min_len:
        sys.exit(f"clean: error: need 1 <= --min-len <= --max-len, got --min-len {args.min_len} --max-len {args.max_len}")
    if args.ratio <= 0:
        sys.exit(f"clean: error: --ratio must be positive, got {args.ratio}")
    src_counts = Counter(lines=0, crlf=0, invalid_utf8=0)
    tgt_counts = Counter(lines=0, crlf=0, invalid_utf8=0)
    dropped = Counter(length=0, ratio=0, invalid_utf8=0)
    missing = object()
    with open(args.src, "rb") as fsrc, open(args.tgt, "rb") as ftgt, AtomicOutput(
        args.src_out
    ) as osrc, AtomicOutput(args.tgt_out) as otgt:
        for raw_src, raw_tgt in itertools.zip_longest(fsrc, ftgt, fillvalue=missing):
            if raw_src is missing or raw_tgt is missing:
                n_src = src_counts["lines"] + (raw_src is not missing) + count_rest(fsrc)
                n_tgt = tgt_counts["lines"] + (raw_tgt is not missing) + count_rest(ftgt)
                sys.exit(f"clean: error: line counts differ: {args.src} has {n_src} lines, {args.tgt} has {n_tgt} lines")
            src_counts["lines"] += 1
            tgt_counts["lines"] += 1
            src = decode_line(raw_src, src_counts).split()
            tgt = decode_line(raw_tgt, tgt_counts).split()
            n, m = len(src), len(tgt)
            if any(REPLACEMENT_CHAR in tok for tok in itertools.chain(src, tgt)):
                dropped["invalid_utf8"] += 1
            elif not (args.min_len <= n <= args.max_len and args.min_len <= m <= args.max_len):
                dropped["length"] += 1
            elif n / m > args.ratio or m / n > args.ratio:
                dropped["ratio"] += 1
            else:
                osrc.write(" ".join(src).encode("utf-8") + b"\n")
                otgt.write(" ".join(tgt).encode("utf-8") + b"\n")
    report("clean", args.src, src_counts)
    report("clean", args.tgt, tgt_counts)
    total = src_counts["lines"]
    print(
        f"clean: kept {total - sum(dropped.values())} of {total} pairs; dropped {dropped['length']} "
        f"outside length [{args.min_len}, {args.max_len}], {dropped['ratio']} over ratio {args.ratio}, "
        f"{dropped['invalid_utf8']} with invalid UTF-8",
        file=sys.stderr,
    )


# ---------------------------------------------------------------- sentencepiece


def run_spm_train(args):
    import sentencepiece as spm

    try:
        spm.SentencePieceTrainer.train(
            input=",".join(args.input),
            model_prefix=args.model_prefix,
            vocab_size=args.vocab_size,
            character_coverage=args.character_coverage,
            model_type="unigram",
            input_sentence_size=args.input_sentence_size,
            shuffle_input_sentence=True,
            num_threads=args.workers,
            minloglevel=1,
        )
    except RuntimeError as error:  # e.g. a vocabulary smaller than the character set
        sys.exit(f"spm-train: error: {str(error).splitlines()[-1]}")


def run_spm_encode(args):
    import sentencepiece as spm

    if not os.path.isfile(args.model):
        sys.exit(f"spm-encode: error: no such --model file: {args.model}")
    sp = spm.SentencePieceProcessor(model_file=args.model)
    for path_in, path_out in zip(args.input, args.output):
        counts = Counter(lines=0, crlf=0, invalid_utf8=0)
        with open_in(path_in) as fin, AtomicOutput(path_out) as fout:
            for raw in fin:
                counts["lines"] += 1
                pieces = sp.encode(decode_line(raw, counts), out_type=str)
                fout.write(" ".join(pieces).encode("utf-8") + b"\n")
        report("spm-encode", path_in, counts)


# ---------------------------------------------------------------- command line


def get_parser():
    parser = argparse.ArgumentParser(prog="fairseq-plugins-tokenize", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    def io_args(p, workers=True):
        p.add_argument("-i", "--input", nargs="+", default=["-"], help="input files, '-' for stdin (default)")
        p.add_argument(
            "-o", "--output", nargs="+", default=["-"],
            help="one output per input, each written as OUTPUT.part then renamed; '-' for stdout (default)",
        )
        if workers:
            p.add_argument("--workers", type=int, default=1, help="worker processes (line order is kept)")

    tok = commands.add_parser("tokenize", help="normalise punctuation and tokenize (Moses tokenizer.perl -a)")
    tok.add_argument("-l", "--lang", required=True, help="language code, e.g. en, de, fr")
    tok.add_argument("--no-normalize", action="store_true", help="skip normalize-punctuation")
    tok.add_argument("--no-aggressive", dest="aggressive", action="store_false", help="do not split hyphens (tokenizer.perl without -a)")
    tok.add_argument("--no-escape", action="store_true", help="do not escape & | < > ' \" [ ] as XML entities")
    io_args(tok)

    detok = commands.add_parser("detokenize", help="Moses detokenizer.perl")
    detok.add_argument("-l", "--lang", required=True, help="language code, e.g. en, de, fr")
    detok.add_argument("--no-escape", action="store_true", help="do not un-escape XML entities")
    io_args(detok)

    clean = commands.add_parser("clean", help="clean-corpus-n.perl: drop pairs by length and length ratio")
    clean.add_argument("--src", required=True, help="source side, tokenized")
    clean.add_argument("--tgt", required=True, help="target side, tokenized, same line count")
    clean.add_argument("--src-out", required=True, help="kept source lines")
    clean.add_argument("--tgt-out", required=True, help="kept target lines")
    clean.add_argument("--min-len", type=int, default=1, help="fewest tokens per side (default 1)")
    clean.add_argument("--max-len", type=int, default=250, help="most tokens per side (default 250)")
    clean.add_argument("--ratio", type=float, default=1.5, help="largest allowed length ratio either way (default 1.5)")

    spm_train = commands.add_parser("spm-train", help="learn one sentencepiece model on several files")
    spm_train.add_argument("--input", nargs="+", required=True, help="training text files (e.g. both languages)")
    spm_train.add_argument("--model-prefix", required=True, help="writes PREFIX.model and PREFIX.vocab")
    spm_train.add_argument("--vocab-size", type=int, required=True, help="size of the joint vocabulary")
    spm_train.add_argument("--character-coverage", type=float, default=1.0, help="default 1.0 (Latin scripts)")
    spm_train.add_argument("--input-sentence-size", type=int, default=10_000_000, help="sentences sampled for training")
    spm_train.add_argument("--workers", type=int, default=1, help="trainer threads")

    spm_encode = commands.add_parser("spm-encode", help="split text into sentencepiece pieces")
    spm_encode.add_argument("--model", required=True, help="PREFIX.model from spm-train")
    io_args(spm_encode, workers=False)
    return parser


def main(argv=None):
    args = get_parser().parse_args(argv)
    if args.command != "spm-train" and "input" in args and len(args.input) != len(args.output):
        sys.exit(f"{args.command}: error: {len(args.input)} --input files but {len(args.output)} --output files")
    for name in ("input", "src", "tgt"):
        paths = getattr(args, name, [])
        for path in [paths] if isinstance(paths, str) else paths:
            if path != "-" and not os.path.isfile(path):
                sys.exit(f"{args.command}: error: no such --{name} file: {path}")
    if getattr(args, "workers", 1) < 1:
        sys.exit(f"{args.command}: error: --workers must be >= 1, got {args.workers}")
    if args.command in ("tokenize", "detokenize"):
        run_moses(args, args.command)
    elif args.command == "clean":
        run_clean(args)
    elif args.command == "spm-train":
        run_spm_train(args)
    else:
        run_spm_encode(args)


if __name__ == "__main__":
    main()
