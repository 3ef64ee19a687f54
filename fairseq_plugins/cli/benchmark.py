"""Side-by-side benchmark of the suite's models against fairseq's built-ins, in one run.

    fairseq-plugins-benchmark [--data DIR] [--preset tiny|cpu|base|big] [--device cpu|cuda]
                              [--fp16 | --bf16] [--repeats 3] [--budget-minutes M] [--out FILE]

What is measured and how: :mod:`fairseq_plugins.benchmarks`.
"""
import argparse
import os
import sys

from fairseq_plugins.benchmarks.harness import log, run
from fairseq_plugins.benchmarks.presets import PAIR_NAMES, PRESETS
from fairseq_plugins.errors import PluginError

def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fairseq-plugins-benchmark",
        description="Training and generation throughput, peak memory and model FLOP/s of the suite's "
                    "vaswani_transformer and rnnsearch against fairseq's transformer and lstm, in one run.")
    parser.add_argument("--data", help="fairseq-preprocess output with a test split (default: the synthetic "
                                       "corpus of the preset, made in a temporary directory)")
    parser.add_argument("--source-lang", help="source language of --data (default: inferred)")
    parser.add_argument("--target-lang", help="target language of --data (default: inferred)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu",
                        help="model sizes and default lengths: tiny (tests), cpu (3+3 layers, d=256; "
                             "rnn 256/512), base and big (the papers' sizes, for GPUs)")
    parser.add_argument("--pairs", default=",".join(PAIR_NAMES),
                        help=f"comma-separated pairs to run, of {', '.join(PAIR_NAMES)} (default: both)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where to run (default: cpu)")
    precision = parser.add_mutually_exclusive_group()
    precision.add_argument("--fp16", action="store_true", help="fairseq's --fp16 (CUDA only)")
    precision.add_argument("--bf16", action="store_true",
                           help="bf16 through torch.autocast with fp32 weights (fairseq's --bf16 needs a TPU)")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per model, interleaved (default: 3)")
    parser.add_argument("--warmup", type=int, help="untimed updates before timing (default: per preset)")
    parser.add_argument("--updates", type=int, help="timed updates per training measurement (default: per preset)")
    parser.add_argument("--sentences", type=int, help="test sentences per generation measurement (default: per preset)")
    parser.add_argument("--gen-batch", type=int, help="sentences per generation batch (default: per preset)")
    parser.add_argument("--min-len", type=int,
                        help="shortest hypothesis (fairseq-generate's --min-len): the few updates a benchmark "
                             "trains leave models that stop after a few words (default: the shortest sentence "
                             "of the synthetic corpus; 1 with --data)")
    parser.add_argument("--max-tokens", type=int, help="training batch size in tokens (default: per preset, "
                                                       "4096 but for tiny)")
    parser.add_argument("--num-workers", type=int, default=0,
                        help="fairseq data-loading worker processes in training (default: 0, load in-process)")
    parser.add_argument("--threads", type=int,
                        help="torch CPU threads per measurement (default: torch's, one per core). On a machine "
                             "shared with other processes, fewer threads than cores avoid stalls at every "
                             "parallel region")
    parser.add_argument("--budget-minutes", type=float,
                        help="bound on the whole run; fewer updates/sentences when they would not fit "
                             "(default: per preset, 7 for base/big)")
    parser.add_argument("--out", help="also write the markdown report to this file")
    return parser


def parse_args(argv=None):
    parser = get_parser()
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset]
    for name, key in (("warmup", "warmup"), ("updates", "updates"), ("sentences", "sentences"),
                      ("gen_batch", "gen_batch"), ("max_tokens", "max_tokens"), ("budget_minutes", "budget")):
        if getattr(args, name) is None:
            setattr(args, name, preset[key])
    args.pairs = [p.strip() for p in args.pairs.split(",") if p.strip()]

    def error(message):
        parser.error(message)

    for pair in args.pairs:
        if pair not in PAIR_NAMES:
            error(f"--pairs: unknown pair {pair!r} (choose from {', '.join(PAIR_NAMES)})")
    if not args.pairs:
        error("--pairs: no pair given")
    check_run_args(args, parser, preset,
                   ("repeats", "warmup", "updates", "sentences", "gen_batch", "max_tokens", "min_len", "threads"))
    if args.num_workers < 0:
        error(f"--num-workers must be >= 0, got {args.num_workers}")
    if args.fp16 and args.device != "cuda":
        error("--fp16 needs --device cuda (fairseq's fp16 training does not run on CPU); use --bf16 on CPU")
    if args.min_len is None:
        args.min_len = 1 if args.data else preset["corpus"][3]
    return args


def check_run_args(args, parser: argparse.ArgumentParser, preset: dict, positive):
    """What this command and fairseq-plugins-benchmark-scale check alike (one-line errors), and
    what follows from it: ``lang_flags`` and ``data_label``."""
    for name in positive:
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.budget_minutes <= 0:
        parser.error(f"--budget-minutes must be positive, got {args.budget_minutes}")
    if args.data is not None and not os.path.isdir(args.data):
        parser.error(f"--data {args.data}: no such directory")
    if bool(args.source_lang) != bool(args.target_lang):
        parser.error("--source-lang and --target-lang go together")
    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        parser.error(f"--out {args.out}: its directory does not exist")
    args.lang_flags = ["--source-lang", args.source_lang, "--target-lang", args.target_lang] if args.source_lang else []
    train, _, test, min_len, max_len = preset["corpus"]
    args.data_label = (args.data if args.data else
                       f"synthetic corpus ({train} training pairs, {min_len}-{max_len} tokens, test {test})")


def main(argv=None):
    args = parse_args(argv)
    # measurements fork from this process: CUDA must not be initialised here, not even by an
    # availability check (torch's NVML-based check leaves the driver alone)
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    report_to_out(args, run, "fairseq-plugins-benchmark")


def report_to_out(args, make_report, prog: str):
    """Print ``make_report(args)`` and write it to ``--out``; a PluginError becomes one line."""
    try:
        report = make_report(args)
    except PluginError as e:
        sys.exit(f"{prog}: error: {e}")
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)
        log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
