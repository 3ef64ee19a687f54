"""``fairseq-plugins-benchmark engines``: fairseq-generate against exports of given checkpoints.

    fairseq-plugins-benchmark engines DATA CHECKPOINT [CHECKPOINT ...] [--threads 1 2]
                                      [--engine ctranslate2 onnx] [--out FILE]

Also installed as ``fairseq-plugins-benchmark-ctranslate2``, its name before sub-commands.
What is measured and how: :mod:`fairseq_plugins_lab.benchmarks.engines`, the one timing of every
engine (``models --onnx --ctranslate2`` times the same on the models it trains).
"""
from fairseq_plugins.cli.common import ArgumentParser, cli_main
from fairseq_plugins_lab.benchmarks.engines import EXPORTS, load_export, run
from fairseq_plugins_lab.benchmarks.report import write_report

PROG = "fairseq-plugins-benchmark-ctranslate2"  # run alone, under its old name


def get_parser(prog: str = PROG) -> ArgumentParser:
    parser = ArgumentParser(
        prog=prog,
        description="Sentences/s and BLEU of fairseq-generate and of float32/int8 exports of the checkpoints "
                    "(CTranslate2: vaswani_transformer; ONNX Runtime: any family), on the same test split.")
    parser.add_argument("data", help="fairseq-preprocess output (dictionaries and the test split)")
    parser.add_argument("checkpoints", nargs="+", help="the checkpoints (vaswani_transformer for CTranslate2)")
    parser.add_argument("--subset", default="test", help="split to translate (default: test)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1], help="thread counts (default: 1)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per engine, interleaved (default: 3)")
    parser.add_argument("--beam", type=int, default=4, help="beam size (default: 4)")
    parser.add_argument("--max-len", type=int, default=200,
                        help="longest hypothesis, both engines (fairseq's --max-len-b; default: 200)")
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per batch (default: 32)")
    parser.add_argument("--engine", choices=EXPORTS, nargs="+", default=["ctranslate2"],
                        help="the exports measured against fairseq-generate, in one run: CTranslate2 "
                             "(vaswani_transformer) and/or fairseq-plugins-export-onnx (any family); "
                             "default ctranslate2")
    parser.add_argument("--out", help="also write the markdown report to this file")
    return parser


def main(argv=None, prog: str = PROG):
    def body(args):
        # once each, in the order given
        exports = {name: load_export(name, f"--engine {name}") for name in dict.fromkeys(args.engine)}
        write_report(run(args, exports), args.out)

    cli_main(lambda: get_parser(prog), body, argv)


if __name__ == "__main__":
    main()
