"""``fairseq-plugins-benchmark COMMAND ...``: the project's benchmarks, one command.

    fairseq-plugins-benchmark models  [--preset tiny|cpu|base|big] [--onnx] [--ctranslate2] ...
    fairseq-plugins-benchmark engines DATA CHECKPOINT [CHECKPOINT ...] [--engine ctranslate2 onnx] ...
    fairseq-plugins-benchmark scale   [--preset tiny|cpu] [--processes 2] ...
    fairseq-plugins-benchmark serve   MODEL --sentences FILE [-- SERVER FLAGS]

``models`` is the default: with no sub-command the flags are its own, as before sub-commands. The
console scripts ``fairseq-plugins-benchmark-ctranslate2``, ``-scale`` and ``-serve`` run
``engines``, ``scale`` and ``serve`` under their old names.
"""
import argparse
import importlib
import sys

from fairseq_plugins.cli.common import ArgumentParser

PROG = "fairseq-plugins-benchmark"
# sub-command: its module under fairseq_plugins_lab.cli (imported only to run it: serve needs no torch._dynamo), help
COMMANDS = {
    "models": ("benchmark_models", "the suite's models against fairseq's built-ins: training and generation speed, "
                                   "memory, FLOP/s; --onnx and --ctranslate2 add their exports (the default)"),
    "engines": ("benchmark_engines", "fairseq-generate against CTranslate2 and ONNX Runtime exports of given "
                                     "checkpoints on a test split: sentences/s, BLEU, hypotheses equal to fairseq's"),
    "scale": ("benchmark_scale", "fairseq-train target words/s on CPU: ours and the built-in transformer, fp32 and "
                                 "bf16, 1 process × N threads and N processes × 1 thread"),
    "serve": ("benchmark_serve", "fairseq-plugins-serve under concurrent clients on 127.0.0.1, batched vs "
                                 "--max-batch-tokens 1: requests/s, p50/p95 latency"),
}


def _command(name: str):
    return importlib.import_module(f"fairseq_plugins_lab.cli.{COMMANDS[name][0]}")


def get_parser() -> ArgumentParser:
    """The command's own --help and the sub-command's name; :func:`main` hands the rest of the
    command line to that sub-command's parser (its module's ``get_parser``)."""
    parser = ArgumentParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,  # the epilog's lines as written
        description="The project's benchmarks of the suite against fairseq's built-ins and its exports.",
        epilog=f"with no sub-command, the flags are those of models:\n"
               f"  {PROG} --preset tiny  is  {PROG} models --preset tiny\n"
               f"the flags of a sub-command: {PROG} COMMAND --help\n"
               f"also installed under their old names:\n  {PROG}-ctranslate2 (engines), {PROG}-scale, {PROG}-serve")
    commands = parser.add_subparsers(title="sub-commands", metavar="COMMAND")
    for name, (_, summary) in COMMANDS.items():
        commands.add_parser(name, help=summary)
    return parser


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in COMMANDS:
        return _command(argv[0]).main(argv[1:], prog=f"{PROG} {argv[0]}")
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        return _command("models").main(argv, prog=PROG)  # no sub-command: models, under the command's name
    get_parser().parse_args(argv)  # --help, or one line naming the unknown sub-command


if __name__ == "__main__":
    main()
