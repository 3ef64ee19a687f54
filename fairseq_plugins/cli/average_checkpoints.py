"""Average the parameters of several checkpoints, as the Transformer paper evaluates.

    fairseq-plugins-average --inputs CKPT_DIR --num-update-checkpoints 5 --output avg.pt
    fairseq-plugins-average --inputs CKPT_DIR --num-epoch-checkpoints 20 --output avg.pt
    fairseq-plugins-average --inputs a.pt b.pt c.pt --output avg.pt

Checkpoints are read with fairseq's loader (weights-only, see ``fairseq_plugins.compat``)
and written atomically with fairseq's ``torch_persistent_save``, so ``fairseq-generate --path avg.pt``
loads the result. The output keeps the newest input's configuration and drops optimizer
state (an average is evaluated, not resumed). On any error nothing is written.
"""
import argparse
import os
import re
import sys

from fairseq_plugins.compat import load_state, save_state
from fairseq_plugins.errors import PluginError

EPOCH_PATTERN = re.compile(r"^checkpoint(\d+)\.pt$")
UPDATE_PATTERN = re.compile(r"^checkpoint_\d+_(\d+)\.pt$")


def last_checkpoints(directory, n, pattern, upper_bound=None):
    """The ``n`` newest checkpoints in ``directory`` whose names match ``pattern``."""
    numbered = []
    for name in os.listdir(directory):
        match = pattern.match(name)
        if match and (upper_bound is None or int(match.group(1)) <= upper_bound):
            numbered.append((int(match.group(1)), os.path.join(directory, name)))
    if len(numbered) < n:
        kind = "epoch" if pattern is EPOCH_PATTERN else "update"
        raise PluginError(f"{directory}: asked for the last {n} {kind} checkpoints, found {len(numbered)}")
    return [path for _, path in sorted(numbered)[-n:]]


def average_states(paths):
    """Mean of the model parameters of ``paths``; the other entries of the newest one.

    Sums are kept in float64 so the mean does not depend on the order of the inputs.
    """
    sums, reference, reference_path, state = None, None, None, None
    for path in paths:
        state = load_state(path)
        model = state["model"]
        shapes = {k: tuple(v.shape) for k, v in model.items()}
        if reference is None:
            reference, reference_path = shapes, path
            sums = {k: v.double() for k, v in model.items()}
            continue
        if shapes != reference:
            differing = sorted(set(shapes.items()) ^ set(reference.items()))[0][0]
            raise PluginError(
                f"{path}: parameters differ from {reference_path} (first at '{differing}'): different architectures"
            )
        for k, v in model.items():
            sums[k] += v.double()
    dtypes = {k: v.dtype for k, v in state["model"].items()}
    state["model"] = {k: (s / len(paths)).to(dtypes[k]) for k, s in sums.items()}
    state["last_optimizer_state"] = None
    return state


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
