"""``fairseq-plugins-benchmark scale``: training throughput on CPU, processes × precision × model, in one run.

    fairseq-plugins-benchmark scale [--data DIR] [--preset tiny|cpu] [--processes 2] [--repeats 3]
                                    [--budget-minutes M] [--out FILE]

Also installed as ``fairseq-plugins-benchmark-scale``, its name before sub-commands.
What is measured and how: :mod:`fairseq_plugins_lab.benchmarks.scale`.
"""
from fairseq_plugins.cli.common import ArgumentParser, add_data_args, cli_main
from fairseq_plugins_lab.benchmarks import scale
from fairseq_plugins_lab.benchmarks.presets import PRESETS, complete_run_args
from fairseq_plugins_lab.benchmarks.report import write_report

PROG = "fairseq-plugins-benchmark-scale"  # run alone, under its old name


def get_parser(prog: str = PROG) -> ArgumentParser:
    parser = ArgumentParser(
        prog=prog,
        description="fairseq-train target words/s of vaswani_transformer and fairseq's transformer, fp32 and "
                    "bf16, 1 process × N threads and N processes × 1 thread, in one run (CPU).")
    add_data_args(parser, "fairseq-preprocess output (default: the synthetic corpus of the preset, made in a "
                          "temporary directory)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu",
                        help="model size, batch and updates of fairseq-plugins-benchmark: tiny (tests) or cpu "
                             "(3+3 layers, d=256, --max-tokens 4096)")
    parser.add_argument("--processes", type=int, default=2,
                        help="N: N processes × 1 thread against 1 process × N threads (default: 2)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per cell, interleaved (default: 3)")
    parser.add_argument("--warmup", type=int, help="updates left out of each figure (default: per preset)")
    parser.add_argument("--updates", type=int, help="timed updates per run (default: per preset)")
    parser.add_argument("--max-tokens", type=int, help="batch size in tokens per process (default: per preset)")
    parser.add_argument("--budget-minutes", type=float,
                        help=f"bound on the whole run, making the corpus included (default: "
                             f"{scale.DEFAULT_BUDGET_MINUTES}; tiny: {scale.BUDGET_MINUTES['tiny']})")
    parser.add_argument("--out", help="also write the markdown report to this file")
    return parser


def check_args(args):
    """The preset's defaults for the flags not given, and one-line errors for impossible ones."""
    preset = PRESETS[args.preset]
    for name, key in (("warmup", "warmup"), ("updates", "updates"), ("max_tokens", "max_tokens")):
        if getattr(args, name) is None:
            setattr(args, name, preset[key])
    if args.budget_minutes is None:
        args.budget_minutes = scale.BUDGET_MINUTES.get(args.preset, scale.DEFAULT_BUDGET_MINUTES)
    complete_run_args(args, preset, ("processes", "repeats", "warmup", "updates", "max_tokens"))
    return args


def main(argv=None, prog: str = PROG):
    cli_main(lambda: get_parser(prog), lambda args: write_report(scale.run(check_args(args)), args.out), argv)


if __name__ == "__main__":
    main()
