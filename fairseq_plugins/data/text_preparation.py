"""Moses-style text preparation in Python (sacremoses): no Perl, no mosesdecoder checkout.

The library behind ``fairseq-plugins-tokenize``; its sub-commands (each reads and writes UTF-8, one sentence per line):

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
import functools
import itertools
import multiprocessing
import os
import sys
from collections import Counter

import regex

from fairseq_plugins.errors import ConfigError

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
        raise ConfigError(
            f"clean: need 1 <= --min-len <= --max-len, got --min-len {args.min_len} --max-len {args.max_len}")
    if args.ratio <= 0:
        raise ConfigError(f"clean: --ratio must be positive, got {args.ratio}")
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
                raise ConfigError(
                    f"clean: line counts differ: {args.src} has {n_src} lines, {args.tgt} has {n_tgt} lines")
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
        raise ConfigError(f"spm-train: {str(error).splitlines()[-1]}")


def run_spm_encode(args):
    import sentencepiece as spm

    if not os.path.isfile(args.model):
        raise ConfigError(f"spm-encode: no such --model file: {args.model}")
    sp = spm.SentencePieceProcessor(model_file=args.model)
    for path_in, path_out in zip(args.input, args.output):
        counts = Counter(lines=0, crlf=0, invalid_utf8=0)
        with open_in(path_in) as fin, AtomicOutput(path_out) as fout:
            for raw in fin:
                counts["lines"] += 1
                pieces = sp.encode(decode_line(raw, counts), out_type=str)
                fout.write(" ".join(pieces).encode("utf-8") + b"\n")
        report("spm-encode", path_in, counts)
