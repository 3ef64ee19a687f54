"""Import a checkpoint of fairseq's built-in ``transformer`` into ``vaswani_transformer``.

    fairseq-plugins-convert-transformer IN.pt OUT.pt [--force]

What is converted and refused: :mod:`fairseq_plugins.models.transformer_convert`.
"""
import os

from fairseq_plugins.checkpoints import save_state
from fairseq_plugins.cli.common import ArgumentParser, cli_main
from fairseq_plugins.errors import ConfigError
from fairseq_plugins.models.transformer_convert import ARCH, convert_checkpoint


def get_parser():
    parser = ArgumentParser(
        prog="fairseq-plugins-convert-transformer",
        description="Convert a checkpoint of fairseq's built-in transformer (any of its "
                    "architectures) into a vaswani_transformer checkpoint with the same outputs.")
    parser.add_argument("input", help="checkpoint written by fairseq-train --arch transformer*")
    parser.add_argument("output", help="where to write the vaswani_transformer checkpoint")
    parser.add_argument("--force", action="store_true", help="overwrite OUTPUT if it exists")
    return parser


def main(argv=None):
    def convert(args):
        if not os.path.isfile(args.input):
            raise ConfigError(f"input checkpoint {args.input} does not exist")
        if os.path.exists(args.output) and not args.force:
            raise ConfigError(f"output {args.output} exists; pass --force to overwrite it")
        state = convert_checkpoint(args.input)
        save_state(state, args.output)
        model = state["cfg"]["model"]
        print(f"wrote {args.output}: {ARCH} {model.encoder_layers}+{model.decoder_layers} layers, "
              f"d_model {model.encoder_embed_dim}, fairseq positions, "
              f"normalize_before {model.encoder_normalize_before}/{model.decoder_normalize_before}")

    cli_main(get_parser, convert, argv)


if __name__ == "__main__":
    main()
