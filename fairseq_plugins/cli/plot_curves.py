"""Training curves of fairseq-train runs: train/valid loss, perplexity and learning rate.

    fairseq-plugins-plot-curves --log base=base/train.log --log ls=ls/train.log --out curves

The computation is in :mod:`fairseq_plugins.analysis.plot_curves`.
"""
from fairseq_plugins.analysis import plot_curves
from fairseq_plugins.cli import common


def get_parser():
    parser = common.ArgumentParser(prog="fairseq-plugins-plot-curves", description=__doc__.split("\n")[0])
    parser.add_argument("--log", action="append", required=True, metavar="[NAME=]FILE",
                        help="fairseq-train log (console output or --log-file) of one run; repeat for several")
    common.add_out_arg(parser, "curves")
    return parser


def main(argv=None):
    common.cli_main(get_parser, plot_curves.run, argv)


if __name__ == "__main__":
    main()
