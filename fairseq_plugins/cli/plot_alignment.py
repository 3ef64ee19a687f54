"""Attention heat-maps: the weights alpha_ij of target word i on source word j (Bahdanau Fig. 3).

The computation is in :mod:`fairseq_plugins.analysis.plot_alignment`.
"""
from fairseq_plugins.analysis import plot_alignment
from fairseq_plugins.cli import common


def get_parser():
    parser = common.ArgumentParser(prog="fairseq-plugins-plot-alignment", description=__doc__.split("\n")[0])
    src = parser.add_argument_group("from fairseq-generate --print-alignment output")
    src.add_argument("--gen", metavar="FILE", help="fairseq-generate output with A- lines")
    run = parser.add_argument_group("from a checkpoint run in-process")
    run.add_argument("--path", metavar="CKPT", help="model checkpoint")
    run.add_argument("--data", metavar="DIR", help="binarized data directory of the checkpoint's task")
    run.add_argument("--gen-subset", default="test", help="data split to take the sentences from (default test)")
    run.add_argument("--teacher-forcing", action="store_true",
                     help="attend along the reference instead of the beam-search hypothesis")
    run.add_argument("--beam", type=int, default=5, help="beam size of the hypothesis (default 5)")
    run.add_argument("--user-dir", help="extra fairseq --user-dir to import (models outside this suite)")
    parser.add_argument("--ids", metavar="I,J,...",
                        help="sentence ids to plot (required with --path; default: every sentence of --gen)")
    parser.add_argument("--join-bpe", action="store_true",
                        help="join subword-nmt '@@ ' pieces into words (source columns summed, "
                        "target rows averaged)")
    parser.add_argument("--out", default="alignments", metavar="DIR",
                        help="directory for alignment-<id>.png and alignments.md (default alignments)")
    return parser


def main(argv=None):
    common.cli_main(get_parser, plot_alignment.run, argv)


if __name__ == "__main__":
    main()
