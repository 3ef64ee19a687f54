"""fairseq-plugins-export-ctranslate2 CHECKPOINT OUT_DIR [--quantization Q] [--force] [--data DIR]"""
import argparse
import sys

from fairseq_plugins.errors import PluginError
from fairseq_plugins.export.ctranslate2 import QUANTIZATIONS, export


def main(argv=None):
    parser = argparse.ArgumentParser(
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
    args = parser.parse_args(argv)
    try:
        export(args.checkpoint, args.out_dir, args.quantization, args.force, args.data)
    except PluginError as e:
        sys.exit(f"{parser.prog}: error: {e}")
    except ImportError as e:
        sys.exit(f"{parser.prog}: error: {e.name or 'ctranslate2'} is not installed: "
                 'pip install "fairseq-plugins[deploy]"')
    print(f"wrote {args.out_dir} ({args.quantization or 'float32'})")


if __name__ == "__main__":
    main()
