"""fairseq-plugins-export-onnx CHECKPOINT OUT_DIR [--data DIR] [--force] [--quantize int8 | int8-weights]
[--bpe-codes FILE | --sentencepiece-model FILE] [--beam N --lenpen P --max-len-b N]"""
from fairseq_plugins.cli.common import ArgumentParser, cli_main
from fairseq_plugins.errors import ConfigError
from fairseq_plugins.hardware import cpu_flags, int8_note


def get_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="fairseq-plugins-export-onnx",
        description="Write a checkpoint of any family as an ONNX Runtime folder: encoder.onnx, decoder_step.onnx, "
                    "the vocabularies, the subword model, config.json, the runtime fairseq_plugins_onnx.py and "
                    "index.html, a page that translates in the browser.")
    parser.add_argument("checkpoint", help="checkpoint written by fairseq-train (vaswani_transformer, rnnsearch, "
                                           "rnnencdec or seq2seq_lstm)")
    parser.add_argument("out_dir", help="the folder to write")
    parser.add_argument("--data", metavar="DIR", help="directory with dict.SRC.txt/dict.TGT.txt (default: the "
                                                      "checkpoint's training data directory)")
    parser.add_argument("--force", action="store_true", help="replace OUT_DIR if it is an ONNX model folder")
    parser.add_argument("--quantize", choices=["int8", "int8-weights"],
                        help="int8: every MatMul by a weight multiplies in int8 (dynamic quantization; fast where "
                             "the CPU has VNNI or AMX); int8-weights: int8 weights, float32 products (smaller "
                             "graphs, slower decoding)")
    subword = parser.add_mutually_exclusive_group()
    subword.add_argument("--bpe-codes", metavar="FILE",
                         help="subword-nmt BPE codes the model was trained with (after Moses tokenization)")
    subword.add_argument("--sentencepiece-model", metavar="FILE", help="sentencepiece model applied to raw text")
    gen = parser.add_argument_group("decoding settings (config.json; fairseq-generate's flags and defaults)")
    gen.add_argument("--beam", type=int, default=5, help="beam size (default 5)")
    gen.add_argument("--lenpen", type=float, default=1.0, help="length penalty (default 1)")
    gen.add_argument("--max-len-b", type=int, default=200, help="at most this many tokens before </s> (default 200)")
    return parser


def body(args):
    try:
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        raise ConfigError('onnx is not installed: pip install "fairseq-plugins[onnx]"') from None
    from fairseq_plugins.export.onnx import export

    export(args.checkpoint, args.out_dir, data=args.data, force=args.force, quantize=args.quantize,
           bpe_codes=args.bpe_codes, sentencepiece_model=args.sentencepiece_model, beam=args.beam,
           lenpen=args.lenpen, max_len_b=args.max_len_b)
    print(f"wrote {args.out_dir} ({args.quantize or 'float32'})")
    if args.quantize == "int8":
        print(f"note: {int8_note(cpu_flags())}")


def main(argv=None):
    cli_main(get_parser, body, argv)


if __name__ == "__main__":
    main()
