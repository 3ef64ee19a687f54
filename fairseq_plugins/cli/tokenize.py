"""Moses-style text preparation in Python (sacremoses): no Perl, no mosesdecoder checkout.

    fairseq-plugins-tokenize {tokenize,detokenize,clean,spm-train,spm-encode} ...

What each sub-command does, and the line policy they share: :mod:`fairseq_plugins.data.text_preparation`.
"""
import os

from fairseq_plugins.cli.common import ArgumentParser, cli_main
from fairseq_plugins.data.text_preparation import run_clean, run_moses, run_spm_encode, run_spm_train
from fairseq_plugins.errors import ConfigError


def get_parser():
    parser = ArgumentParser(prog="fairseq-plugins-tokenize", description=__doc__.split("\n")[0])
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


def run(args):
    """Check the files and counts every sub-command shares, then run it."""
    if args.command != "spm-train" and "input" in args and len(args.input) != len(args.output):
        raise ConfigError(f"{args.command}: {len(args.input)} --input files but {len(args.output)} --output files")
    for name in ("input", "src", "tgt"):
        paths = getattr(args, name, [])
        for path in [paths] if isinstance(paths, str) else paths:
            if path != "-" and not os.path.isfile(path):
                raise ConfigError(f"{args.command}: no such --{name} file: {path}")
    if getattr(args, "workers", 1) < 1:
        raise ConfigError(f"{args.command}: --workers must be >= 1, got {args.workers}")
    if args.command in ("tokenize", "detokenize"):
        run_moses(args, args.command)
    else:
        {"clean": run_clean, "spm-train": run_spm_train, "spm-encode": run_spm_encode}[args.command](args)


def main(argv=None):
    cli_main(get_parser, run, argv)


if __name__ == "__main__":
    main()
