"""Average the parameters of several checkpoints, as the Transformer paper evaluates.

    fairseq-plugins-average --inputs CKPT_DIR --num-update-checkpoints 5 --output avg.pt
    fairseq-plugins-average --inputs CKPT_DIR --num-epoch-checkpoints 20 --output avg.pt
    fairseq-plugins-average --inputs a.pt b.pt c.pt --output avg.pt

Checkpoints are read with fairseq's loader (weights-only, see
:func:`fairseq_plugins.checkpoints.load_state`) and written atomically with fairseq's
``torch_persistent_save``, so ``fairseq-generate --path avg.pt`` loads the result. The output
keeps the newest input's configuration and drops optimizer state (an average is evaluated, not
resumed). On any error nothing is written.
"""
import os

from fairseq_plugins.checkpoints import average_states, checkpoint_paths, save_state
from fairseq_plugins.cli.common import ArgumentParser, cli_main
from fairseq_plugins.errors import ConfigError


def get_parser():
    p = ArgumentParser(prog="fairseq-plugins-average", description="Average the parameters of fairseq checkpoints.")
    p.add_argument("--inputs", nargs="+", required=True,
                   help="checkpoint files, or one directory with --num-epoch-checkpoints/--num-update-checkpoints")
    p.add_argument("--output", required=True, help="where to write the averaged checkpoint")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--num-epoch-checkpoints", type=int, help="average the last N checkpointE.pt of the directory")
    group.add_argument("--num-update-checkpoints", type=int,
                       help="average the last N checkpoint_E_U.pt of the directory (--save-interval-updates)")
    p.add_argument("--checkpoint-upper-bound", type=int,
                   help="ignore checkpoints after this epoch/update number")
    return p


def main(argv=None):
    def average(args):
        missing = [path for path in args.inputs if not os.path.exists(path)]
        if missing:  # a mistyped folder is named as one, not as a wrong count of folders
            raise ConfigError(f"--inputs {' '.join(missing)}: no such file or folder")
        paths = checkpoint_paths(args.inputs, args.num_epoch_checkpoints, args.num_update_checkpoints,
                                 args.checkpoint_upper_bound)
        print(f"averaging {len(paths)} checkpoints: {', '.join(paths)}", flush=True)
        save_state(average_states(paths), args.output)
        print(f"wrote {args.output}")

    cli_main(get_parser, average, argv)


if __name__ == "__main__":
    main()
