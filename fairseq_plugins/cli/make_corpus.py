"""Deterministic synthetic translation corpus that behaves like a language pair.

    fairseq-plugins-make-corpus --out DIR [--train N --valid N --test N --rare-rate P ...]

What the two languages look like: :mod:`fairseq_plugins.data.synthetic_corpus`.
"""
from fairseq_plugins.cli.common import ArgumentParser, cli_main
from fairseq_plugins.data.synthetic_corpus import write_corpus


def get_parser():
    p = ArgumentParser(prog="fairseq-plugins-make-corpus", description=__doc__.split("\n")[0])
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
    def make(args):
        write_corpus(args.out, args.train, args.valid, args.test, args.min_len, args.max_len, args.test_max_len,
                     args.rare_rate, args.seed)
        print(f"wrote {args.train}/{args.valid}/{args.test} sentence pairs to {args.out}")

    cli_main(get_parser, make, argv)


if __name__ == "__main__":
    main()
