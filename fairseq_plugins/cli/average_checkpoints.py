"""Average the parameters of several checkpoints, as the Transformer paper evaluates.

    fairseq-plugins-average --inputs CKPT_DIR --num-update-checkpoints 5 --output avg.pt
    fairseq-plugins-average --inputs CKPT_DIR --num-epoch-checkpoints 20 --output avg.pt
    fairseq-plugins-average --inputs a.pt b.pt c.pt --output avg.pt

Checkpoints are read with fairseq's loader (weights-only, see
``fairseq_plugins.patches.checkpoint_loading``) and written atomically with fairseq's
``torch_persistent_save``, so ``fairseq-generate --path avg.pt`` loads the result. The output keeps the newest input's configuration and drops optimizer
state (an average is evaluated, not resumed). On any error nothing is written.
"""
import argparse
import os
import sys

from fairseq_plugins.checkpoints import EPOCH_PATTERN, UPDATE_PATTERN, average_states, last_checkpoints, save_state
from fairseq_plugins.errors import PluginError


def build_parser():
    p = argparse.ArgumentParser(description="Average the parameters of fairseq checkpoints.")
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


def resolve_inputs(args):
    count = args.num_epoch_checkpoints or args.num_update_checkpoints
    if count is None:
        for path in args.inputs:
            if not os.path.isfile(path):
                raise PluginError(f"{path}: no such checkpoint file")
        return args.inputs
    if count < 1:
        raise PluginError(f"asked to average {count} checkpoints: need at least 1")
    if len(args.inputs) != 1 or not os.path.isdir(args.inputs[0]):
        raise PluginError(f"{' '.join(args.inputs)}: --num-*-checkpoints needs exactly one checkpoint directory")
    pattern = EPOCH_PATTERN if args.num_epoch_checkpoints else UPDATE_PATTERN
    return last_checkpoints(args.inputs[0], count, pattern, args.checkpoint_upper_bound)


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        paths = resolve_inputs(args)
        print(f"averaging {len(paths)} checkpoints: {', '.join(paths)}", flush=True)
        state = average_states(paths)
        save_state(state, args.output)
    except PluginError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
