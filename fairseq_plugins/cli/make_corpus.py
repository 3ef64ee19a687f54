"""Deterministic synthetic translation corpus that behaves like a language pair.

    fairseq-plugins-make-corpus --out DIR [--train N --valid N --test N --rare-rate P ...]

What the two languages look like: :mod:`fairseq_plugins.data.synthetic_corpus`.
"""
import argparse
import os
import sys

from fairseq_plugins.data.synthetic_corpus import Lexicon, write_split


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="output directory (created if missing)")
    p.add_argument("--train", type=int, default=10000, help="training sentence pairs")
    p.add_argument("--valid", type=int, default=500, help="validation sentence pairs")
    p.add_argument("--test", type=int, default=500, help="test sentence pairs")
    p.add_argument("--min-len", type=int, default=5, help="shortest source sentence, in words (>= 5)")
    p.add_argument("--max-len", type=int, default=30, help="longest source sentence, in words")
    p.add_argument("--test-max-len", type=int, default=None,
                   help="longest source sentence of valid/test (default: --max-len); "
                        "e.g. train up to 50 and test up to 80 as in Bahdanau et al.")
    p.add_argument("--rare-rate", type=float, default=0.0,
                   help="probability that a noun comes from the rare tail of 3000 nouns (exercises <unk>)")
    p.add_argument("--seed", type=int, default=1, help="random seed; same flags give the same files")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    test_max = args.test_max_len if args.test_max_len is not None else args.max_len
    problems = []
    if args.min_len < 5:
        problems.append(f"--min-len {args.min_len} is below 5, the shortest sentence of the grammar")
    if args.min_len > min(args.max_len, test_max):
        problems.append(f"--min-len {args.min_len} exceeds the maximum length {min(args.max_len, test_max)}")
    if args.train <= 0:
        problems.append(f"--train {args.train}: need at least one training sentence")
    if args.valid < 0 or args.test < 0:
        problems.append("--valid/--test must not be negative")
    if not 0.0 <= args.rare_rate <= 1.0:
        problems.append(f"--rare-rate {args.rare_rate} is not a probability")
    if problems:
        print(f"make_corpus: error: {problems[0]}", file=sys.stderr)
        sys.exit(2)
    os.makedirs(args.out, exist_ok=True)
    lexicon = Lexicon(args.seed)
    for split, n, max_len in (("train", args.train, args.max_len), ("valid", args.valid, test_max),
                              ("test", args.test, test_max)):
        write_split(args.out, split, n, lexicon, args.seed, args.min_len, max_len, args.rare_rate)
    print(f"wrote {args.train}/{args.valid}/{args.test} sentence pairs to {args.out}")


if __name__ == "__main__":
    main()
