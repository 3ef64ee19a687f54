"""An English→LANG parallel corpus from this machine's gettext catalogs, ready for
``fairseq-preprocess --joined-dictionary``.

    fairseq-plugins-catalog-corpus --lang de --out DIR [--bpe-ops 8000 | --sentencepiece-vocab N]

Writes DIR/raw, DIR/tok (sacremoses) and DIR/bpe (subword units) as {train,valid,test}.{en,LANG},
the subword model, and DIR/report.{json,md} (pairs per filter, per split, source-length
histogram). Then:

    fairseq-preprocess --source-lang en --target-lang de --trainpref DIR/bpe/train \\
        --validpref DIR/bpe/valid --testpref DIR/bpe/test --joined-dictionary --destdir data-bin
"""
import sys

from fairseq_plugins.cli.common import ArgumentParser
from fairseq_plugins.data import catalogs
from fairseq_plugins.errors import ConfigError


def parser():
    p = ArgumentParser(prog="fairseq-plugins-catalog-corpus", description=__doc__.split("\n")[0])
    p.add_argument("--lang", required=True, help="target language folder name under the locale folders, e.g. de, pt_BR")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--locale-dir", action="append", metavar="DIR",
                   help="a <prefix>/share/locale folder (repeatable; default: "
                        + ", ".join(catalogs.default_locale_dirs()) + ")")
    p.add_argument("--seed", type=int, default=1, help="seed of the split's hash")
    p.add_argument("--valid", type=int, default=1000, help="validation pairs")
    p.add_argument("--test", type=int, default=1000, help="test pairs")
    p.add_argument("--min-len", type=int, default=1, help="fewest words per side")
    p.add_argument("--max-len", type=int, default=50, help="most words per side")
    p.add_argument("--max-ratio", type=float, default=3.0, help="longest side / shortest side in words")
    p.add_argument("--placeholders", choices=["match", "drop"], default="match",
                   help="match: keep pairs whose sides have the same placeholders (%%s, {0}, $1); drop: drop every pair with one")
    sub = p.add_mutually_exclusive_group()
    sub.add_argument("--bpe-ops", type=int, default=8000, help="joint BPE merges (subword-nmt)")
    sub.add_argument("--sentencepiece-vocab", type=int, default=0, metavar="N",
                     help="a joint sentencepiece unigram model of N pieces instead of BPE")
    return p


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)
    for flag in ("valid", "test", "min_len", "max_len", "bpe_ops"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    opts = catalogs.BuildOptions(
        lang=args.lang, out=args.out, locale_dirs=args.locale_dir or catalogs.default_locale_dirs(),
        seed=args.seed, valid=args.valid, test=args.test,
        filters=catalogs.Filters(args.min_len, args.max_len, args.max_ratio, args.placeholders),
        bpe_ops=args.bpe_ops, sentencepiece_vocab=args.sentencepiece_vocab,
    )
    try:
        report = catalogs.build(opts)
    except ConfigError as e:
        p.error(str(e))
    sys.stdout.write(catalogs.report_markdown(report))


if __name__ == "__main__":
    main()
