"""``fairseq-plugins-benchmark models``: the suite's models against fairseq's built-ins, side by side, in one run.

    fairseq-plugins-benchmark [models] [--data DIR] [--preset tiny|cpu|base|big] [--device cpu|cuda]
                              [--fp16 | --bf16] [--beam 4] [--max-len L] [--repeats 3]
                              [--budget-minutes M] [--onnx] [--ctranslate2] [--out FILE]

The default sub-command: ``fairseq-plugins-benchmark`` with these flags and no sub-command runs it.
What is measured and how: :mod:`fairseq_plugins_lab.benchmarks`.
"""
import os

from fairseq_plugins.cli.common import ArgumentParser, add_data_args, cli_main
from fairseq_plugins.errors import ConfigError
from fairseq_plugins_lab.benchmarks.engines import load_export
from fairseq_plugins_lab.benchmarks.harness import run
from fairseq_plugins_lab.benchmarks.presets import PAIR_NAMES, PRESETS, complete_run_args
from fairseq_plugins_lab.benchmarks.report import write_report

PROG = "fairseq-plugins-benchmark"  # run alone: the command with no sub-command


def get_parser(prog: str = PROG) -> ArgumentParser:
    parser = ArgumentParser(
        prog=prog,
        description="Training and generation throughput, peak memory and model FLOP/s of the suite's "
                    "vaswani_transformer and rnnsearch against fairseq's transformer and lstm, in one run.")
    add_data_args(parser, "fairseq-preprocess output with a test split (default: the synthetic corpus of the "
                          "preset, made in a temporary directory)")
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
    parser.add_argument("--beam", type=int, default=4, help="beam size of generation (default: 4)")
    parser.add_argument("--max-len", type=int,
                        help="fixed-length hypotheses: generation runs with --min-len and --max-len-b L, "
                             "--max-len-a 0, so every hypothesis of both models has L tokens (default: "
                             "lengths from --min-len to 1.2·|x|+10)")
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
    parser.add_argument("--onnx", action="store_true",
                        help="also export the suite's trained model of each pair with fairseq-plugins-export-onnx "
                             "(float32 and int8) and time ONNX Runtime against fairseq-generate on the whole test "
                             "split (beam --beam, lengths 1 to --max-len or 200, batches of --gen-batch); needs "
                             "the [onnx] extra; not bounded by --budget-minutes (the same timing as "
                             "fairseq-plugins-benchmark engines, on the models this run trained)")
    parser.add_argument("--ctranslate2", action="store_true",
                        help="also export the transformer pair's model with fairseq-plugins-export-ctranslate2 "
                             "(float32 and int8) and time CTranslate2 in the same table as --onnx; needs the "
                             "[deploy] extra; not bounded by --budget-minutes")
    parser.add_argument("--out", help="also write the markdown report to this file")
    return parser


def check_args(args):
    """The preset's defaults for the flags not given, and one-line errors for impossible ones."""
    preset = PRESETS[args.preset]
    for name, key in (("warmup", "warmup"), ("updates", "updates"), ("sentences", "sentences"),
                      ("gen_batch", "gen_batch"), ("max_tokens", "max_tokens"), ("budget_minutes", "budget")):
        if getattr(args, name) is None:
            setattr(args, name, preset[key])
    args.pairs = [p.strip() for p in args.pairs.split(",") if p.strip()]
    for pair in args.pairs:
        if pair not in PAIR_NAMES:
            raise ConfigError(f"--pairs: unknown pair {pair!r} (choose from {', '.join(PAIR_NAMES)})")
    if not args.pairs:
        raise ConfigError("--pairs: no pair given")
    complete_run_args(args, preset,
                      ("repeats", "warmup", "updates", "sentences", "gen_batch", "max_tokens", "min_len", "threads",
                       "beam", "max_len"))
    if args.num_workers < 0:
        raise ConfigError(f"--num-workers must be >= 0, got {args.num_workers}")
    if args.fp16 and args.device != "cuda":
        raise ConfigError("--fp16 needs --device cuda (fairseq's fp16 training does not run on CPU); use --bf16 on CPU")
    if args.max_len is not None and args.min_len is not None and args.min_len != args.max_len:
        raise ConfigError(f"--min-len {args.min_len} with --max-len {args.max_len}: --max-len fixes the "
                          "hypothesis length, leave --min-len out")
    if args.min_len is None:
        args.min_len = args.max_len or (1 if args.data else preset["corpus"][3])
    args.exports = {}  # --onnx, --ctranslate2: name -> the export's module, in the report's order
    if args.onnx:
        args.exports["onnx"] = load_export("onnx", "--onnx")
        if args.device != "cpu" or args.fp16 or args.bf16:
            raise ConfigError("--onnx: the ONNX rows run on CPU in float32; leave out --device cuda, --fp16 and --bf16")
    if args.ctranslate2:
        args.exports["ctranslate2"] = load_export("ctranslate2", "--ctranslate2")
        if args.device != "cpu" or args.fp16 or args.bf16:
            raise ConfigError("--ctranslate2: the CTranslate2 rows run on CPU; leave out --device cuda, --fp16 and "
                              "--bf16")
        if "transformer" not in args.pairs:
            raise ConfigError("--ctranslate2: CTranslate2 converts the transformer pair only; add it to --pairs")
    return args


def main(argv=None, prog: str = PROG):
    # measurements fork from this process: CUDA must not be initialised here, not even by an
    # availability check (torch's NVML-based check leaves the driver alone)
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    cli_main(lambda: get_parser(prog), lambda args: write_report(run(check_args(args)), args.out), argv)


if __name__ == "__main__":
    main()
