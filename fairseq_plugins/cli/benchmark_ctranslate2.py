"""fairseq-plugins-benchmark-ctranslate2 DATA CHECKPOINT [CHECKPOINT ...] [--threads 1 2] [--engine onnx] [--out FILE]

What is measured and how: :mod:`fairseq_plugins.benchmarks.ctranslate2` (:mod:`~fairseq_plugins.benchmarks.onnx`).
"""
from fairseq_plugins.benchmarks.ctranslate2 import run
from fairseq_plugins.cli.common import ArgumentParser, cli_main


def get_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="fairseq-plugins-benchmark-ctranslate2",
        description="Sentences/s and BLEU of fairseq-generate and of CTranslate2 float32/int8 exports of "
                    "vaswani_transformer checkpoints, on the same test split.")
    parser.add_argument("data", help="fairseq-preprocess output (dictionaries and the test split)")
    parser.add_argument("checkpoints", nargs="+", help="vaswani_transformer checkpoints")
    parser.add_argument("--subset", default="test", help="split to translate (default: test)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1], help="thread counts (default: 1)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per engine, interleaved (default: 3)")
    parser.add_argument("--beam", type=int, default=4, help="beam size (default: 4)")
    parser.add_argument("--max-len", type=int, default=200,
                        help="longest hypothesis, both engines (fairseq's --max-len-b; default: 200)")
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per batch (default: 32)")
    parser.add_argument("--engine", choices=["ctranslate2", "onnx"], default="ctranslate2",
                        help="the export measured against fairseq-generate: CTranslate2 (vaswani_transformer) or "
                             "fairseq-plugins-export-onnx (any family); default ctranslate2")
    parser.add_argument("--out", help="also write the markdown report to this file")
    return parser


def main(argv=None):
    def body(args):
        if args.engine == "onnx":  # onnxruntime and onnxscript only then
            from fairseq_plugins.benchmarks.onnx import measure_checkpoint

            report = run(args, measure_checkpoint, "ONNX Runtime")
        else:
            report = run(args)
        print(report)
        if args.out:
            with open(args.out, "w", encoding="utf-8") as f:
                f.write(report)

    cli_main(get_parser, body, argv)


if __name__ == "__main__":
    main()
