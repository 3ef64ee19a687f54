"""fairseq-plugins-export-ctranslate2 CHECKPOINT OUT_DIR [--quantization Q] [--force] [--data DIR]"""
from fairseq_plugins.cli.common import ArgumentParser, cli_main
from fairseq_plugins.errors import ConfigError
from fairseq_plugins.export.ctranslate2 import QUANTIZATIONS, export


def get_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="fairseq-plugins-export-ctranslate2",
        description="Write a vaswani_transformer checkpoint as a CTranslate2 model directory "
                    "(weights, config.json, source/target vocabularies).")
    parser.add_argument("checkpoint", help="checkpoint written by fairseq-train --arch vaswani_transformer*")
    parser.add_argument("out_dir", help="the CTranslate2 model directory to write")
    parser.add_argument("--quantization", choices=QUANTIZATIONS,
                        help="weight type of the written model (default: float32)")
    parser.add_argument("--force", action="store_true", help="replace OUT_DIR if it exists")
    parser.add_argument("--data", metavar="DIR",
                        help="directory with dict.SRC.txt/dict.TGT.txt (default: the checkpoint's "
                             "training data directory)")
    return parser


def body(args):
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        raise ConfigError('ctranslate2 is not installed: pip install "fairseq-plugins[deploy]"') from None
    export(args.checkpoint, args.out_dir, args.quantization, args.force, args.data)
    print(f"wrote {args.out_dir} ({args.quantization or 'float32'})")


def main(argv=None):
    cli_main(get_parser, body, argv)


if __name__ == "__main__":
    main()
