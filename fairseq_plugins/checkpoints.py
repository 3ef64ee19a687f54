"""Reading and writing fairseq checkpoints: the library the tools and the patches share.

* :func:`load_state` reads a checkpoint weights-only with one-line errors (see
  :mod:`fairseq_plugins.patches.checkpoint_loading`);
* :func:`save_state` writes one the way fairseq does, atomically (through
  :mod:`fairseq_plugins.patches.atomic_checkpoints`);
* :func:`is_encoder_fast_path_copy` names the redundant entries fairseq 0.12.2 adds;
* :func:`last_checkpoints` and :func:`average_states` pick and average checkpoints
  (``fairseq-plugins-average``); :func:`averaging_window` picks them from the end of the
  training a run actually did (the quickstart and the paper-claims driver).
"""
import os
import re

from fairseq import checkpoint_utils
from omegaconf import DictConfig, OmegaConf

from fairseq_plugins.errors import CheckpointError, ConfigError
from fairseq_plugins.patches.checkpoint_loading import load_checkpoint_to_cpu

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
        raise ConfigError(f"{directory}: asked for the last {n} {kind} checkpoints, found {len(numbered)}")
    return [path for _, path in sorted(numbered)[-n:]]


def averaging_window(directory, n, updates_done, fraction, pattern=UPDATE_PATTERN):
    """The last ``n`` update checkpoints of ``directory`` that lie in the last ``fraction`` of the
    ``updates_done``: a run stopped early (a time limit) averages fewer, never its first weights."""
    low = updates_done * (1 - fraction)
    numbered = []
    for name in os.listdir(directory):
        match = pattern.match(name)
        if match and low < int(match.group(1)) <= updates_done:
            numbered.append((int(match.group(1)), os.path.join(directory, name)))
    return [path for _, path in sorted(numbered)[-n:]]


def checkpoint_paths(inputs, num_epoch_checkpoints=None, num_update_checkpoints=None, upper_bound=None):
    """The files named by ``fairseq-plugins-average --inputs``: themselves, or the last N of a directory."""
    count = num_epoch_checkpoints or num_update_checkpoints
    if count is None:
        for path in inputs:
            if not os.path.isfile(path):
                raise ConfigError(f"{path}: no such checkpoint file")
        return inputs
    if count < 1:
        raise ConfigError(f"asked to average {count} checkpoints: need at least 1")
    if len(inputs) != 1 or not os.path.isdir(inputs[0]):
        raise ConfigError(f"{' '.join(inputs)}: --num-*-checkpoints needs exactly one checkpoint directory")
    pattern = EPOCH_PATTERN if num_epoch_checkpoints else UPDATE_PATTERN
    return last_checkpoints(inputs[0], count, pattern, upper_bound)


def _tied(model):
    """``{name: the first name whose tensor is the same view of the same storage}``: the weights a
    model ties (``--share-all-embeddings``, ``--share-decoder-input-output-embed``) are one stored
    tensor under several names, and must stay one."""
    first = {}
    return {k: first.setdefault((v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape), v.stride()), k)
            for k, v in model.items()}


def average_states(paths):
    """Mean of the model parameters of ``paths``; the other entries of the newest one.

    Sums are kept in float64 so the mean does not depend on the order of the inputs. Tied
    weights are averaged once and stay shared, so the output stores as many tensors as the inputs.
    """
    sums, reference, reference_path, state = None, None, None, None
    for path in paths:
        state = load_state(path)
        model = state["model"]
        layout = {k: (tuple(v.shape), tied) for (k, v), tied in zip(model.items(), _tied(model).values())}
        if reference is None:
            reference, reference_path = layout, path
            sums = {k: v.double() for k, v in model.items() if layout[k][1] == k}
            continue
        if layout != reference:
            differing = sorted(set(layout.items()) ^ set(reference.items()))[0][0]
            raise CheckpointError(
                f"{path}: parameters differ from {reference_path} (first at '{differing}'): different architectures"
            )
        for k in sums:
            sums[k] += model[k].double()
    averaged = {k: (s / len(paths)).to(state["model"][k].dtype) for k, s in sums.items()}
    state["model"] = {k: averaged[tied] for k, (_, tied) in reference.items()}
    state["last_optimizer_state"] = None
    return state


def load_state(path):
    """Read a checkpoint with the suite's safe loader (which refuses a file without model weights)."""
    return load_checkpoint_to_cpu(path)


def save_state(state, path):
    """Write a checkpoint dict the way fairseq does, atomically (temporary name, then rename).

    fairseq's loader turns the stored ``cfg`` into an omegaconf DictConfig; it is stored as
    plain containers again so the file loads weights-only.
    """
    if isinstance(state.get("cfg"), DictConfig):
        state = dict(state, cfg=OmegaConf.to_container(state["cfg"], resolve=True, enum_to_str=True))
    checkpoint_utils.torch_persistent_save(state, path)


def is_encoder_fast_path_copy(key):
    """Whether ``key`` is one of the state-dict entries 0.12.2's encoder layers add for their fast path.

    ``encoder.layers.N.{in_proj,out_proj,fc1,fc2}_{weight,bias}``: copies of ``self_attn``'s
    q/k/v/out projections and of ``fc1``/``fc2`` (zeros in a checkpoint saved by training), so
    a converter can drop them. Checkpoints of other fairseq versions have none.
    """
    return re.search(r"(^|\.)encoder\.layers\.\d+\.(in_proj|out_proj|fc1|fc2)_(weight|bias)$", key) is not None
