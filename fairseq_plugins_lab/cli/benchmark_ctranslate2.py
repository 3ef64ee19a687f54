"""fairseq-plugins-benchmark-ctranslate2 DATA CHECKPOINT [CHECKPOINT ...] [--threads 1 2] [--engine ctranslate2 onnx] [--out FILE]

What is measured and how: :mod:`fairseq_plugins_lab.benchmarks.engines`; the engines:
:mod:`~fairseq_plugins_lab.benchmarks.ctranslate2`, :mod:`~fairseq_plugins_lab.benchmarks.onnx`.
"""
from fairseq_plugins_lab.benchmarks.ctranslate2 import ctranslate2_engines
from fairseq_plugins_lab.benchmarks.engines import run
from fairseq_plugins.cli.common import ArgumentParser, cli_main
from fairseq_plugins.export.ctranslate2 import check_exportable as ctranslate2_exportable

ENGINES = {"ctranslate2": "CTranslate2", "onnx": "ONNX Runtime"}  # --engine: the report's names


def get_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="fairseq-plugins-benchmark-ctranslate2",
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
    parser.add_argument("--engine", choices=ENGINES, nargs="+", default=["ctranslate2"],
                        help="the exports measured against fairseq-generate, in one run: CTranslate2 "
                             "(vaswani_transformer) and/or fairseq-plugins-export-onnx (any family); "
                             "default ctranslate2")
    parser.add_argument("--out", help="also write the markdown report to this file")
    return parser


def main(argv=None):
    def body(args):
        names = list(dict.fromkeys(args.engine))  # once each, in the order given
        exports, checks = [], []
        for name in names:
            if name == "onnx":  # onnxruntime and onnxscript only then
                from fairseq_plugins_lab.benchmarks.onnx import onnx_engines
                from fairseq_plugins.export.onnx import check_exportable

                exports.append(onnx_engines)
                checks.append(check_exportable)
            else:
                exports.append(ctranslate2_engines)
                checks.append(ctranslate2_exportable)
        report = run(args, exports, " and ".join(ENGINES[name] for name in names), checks)
        print(report)
        if args.out:
            with open(args.out, "w", encoding="utf-8") as f:
                f.write(report)

    cli_main(get_parser, body, argv)


if __name__ == "__main__":
    main()
