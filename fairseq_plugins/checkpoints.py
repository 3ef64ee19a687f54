"""Reading and writing fairseq checkpoints: the library the tools and the patches share.

* :func:`load_state` reads a checkpoint weights-only with one-line errors: fairseq's loader inside
  :func:`weights_only_torch_load`, which :mod:`fairseq_plugins.patches.checkpoint_io` also puts
  around fairseq's own loads;
* :func:`save_state` writes one the way fairseq does, atomically (:func:`atomic_write`, which
  :mod:`fairseq_plugins.patches.checkpoint_io` makes fairseq's own saves use);
* :func:`is_encoder_fast_path_copy` names the redundant entries fairseq 0.12.2 adds;
* :func:`last_checkpoints` and :func:`average_states` pick and average checkpoints
  (``fairseq-plugins-average``); :func:`averaging_window` picks them from the end of the
  training a run actually did (the quickstart and the paper-claims driver).
"""
import argparse
import contextlib
import errno
import os
import re
import secrets

import numpy as np
import torch
from fairseq import checkpoint_utils
from omegaconf import DictConfig, OmegaConf

from fairseq_plugins.errors import CheckpointError, ConfigError
from fairseq_plugins.patches._mechanism import Target

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


# -- reading: weights-only, one line naming the file on failure ----------------------------------------------------

TORCH_LOAD = Target(torch, "load")  # fairseq's loaders call torch.load by name

# What fairseq writes: the legacy ``args`` Namespace; metric values that may be numpy
# scalars (``best_loss``, ``val_loss``). Containers, tensors and OrderedDict are allowed
# by torch already; omegaconf configs are stored as plain dicts.
FAIRSEQ_CHECKPOINT_GLOBALS = [
    argparse.Namespace,
    np.dtype,
    (np._core if hasattr(np, "_core") else np.core).multiarray.scalar,
    type(np.dtype(np.float64)),
    type(np.dtype(np.float32)),
    type(np.dtype(np.int64)),
]


def weights_only_torch_load(refuse, check=None):
    """Inside: this thread's ``torch.load`` is weights-only; a failure becomes ``refuse(f, error)``;
    ``check(f, obj)``, if given, sees what was loaded before the caller does (and may raise).

    A scoped :meth:`~fairseq_plugins.patches._mechanism.Target.replaced`: that thread's calls reach
    whatever ``torch.load`` was when the window opened (a later wrapper or a test's mock included);
    other threads' calls pass through, and that value is put back afterwards.
    """
    def load(f, *args, **kwargs):
        kwargs["weights_only"] = True
        try:
            obj = TORCH_LOAD(f, *args, **kwargs)
        except Exception as e:  # whatever the bytes make torch raise, the file is the cause
            raise refuse(f, e) from None
        if check is not None:
            check(f, obj)
        return obj
    return TORCH_LOAD.replaced(load)


def allowing(classes):
    """``add_safe_globals(classes)`` as a setup, with its teardown (torch < 2.4 has no allowlist)."""
    serialization = torch.serialization
    if not hasattr(serialization, "add_safe_globals"):
        return None, None
    before = []

    def setup():
        before[:] = serialization.get_safe_globals()
        serialization.add_safe_globals(classes)

    def teardown():
        serialization.clear_safe_globals()
        serialization.add_safe_globals(before)
    return setup, teardown


def refusal(name, error):
    """One line saying why ``name`` could not be read as a checkpoint."""
    text = str(error)
    operand = re.search(r"Unsupported operand (\d+)", text)
    if operand:
        return (f"{name}: not a readable checkpoint, truncated or not a torch file (pickle instruction "
                f"{operand.group(1)} is refused by the weights-only loader)")
    match = re.search(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) ([\w.]+)", text)
    if match:
        return (f"{name}: refused to load: it needs {match.group(1)}, which fairseq checkpoints never hold "
                "(a pickle that could run code)")
    # Skip torch's generic preamble ("Weights only load failed...", "Check the documentation").
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(("Weights only", "Check the doc"))]
    first_line = (lines or [type(error).__name__])[0]
    return f"{name}: not a readable checkpoint, truncated or not a torch file ({type(error).__name__}: {first_line})"


def refused(f, error):
    return CheckpointError(refusal(getattr(f, "name", f), error))


def fairseq_checkpoint(f, state):
    """What every reader of a fairseq checkpoint takes for granted: a dict with the model's weights."""
    name = getattr(f, "name", f)
    if not isinstance(state, dict):
        raise CheckpointError(f"{name}: not a fairseq checkpoint (a {type(state).__name__}, not a dict of entries)")
    if "model" not in state:
        raise CheckpointError(f"{name}: not a fairseq checkpoint (no 'model' entry)")


def load_with(load, path, *args, **kwargs):
    """``load`` (fairseq's ``load_checkpoint_to_cpu``) weights-only on every torch version, with one-line errors."""
    with weights_only_torch_load(refused, check=fairseq_checkpoint):
        try:
            return load(path, *args, **kwargs)
        except KeyError as missing:  # fairseq's upgrade of older layouts indexes entries this file lacks
            raise CheckpointError(f"{path}: not a complete fairseq checkpoint (fairseq's loader found no "
                                  f"{missing} entry)") from None


def load_state(path):
    """Read a checkpoint with the suite's safe loader (which refuses a file without model weights)."""
    return load_with(checkpoint_utils.load_checkpoint_to_cpu, path)


# -- writing: complete or absent -------------------------------------------------------------------------------------

def _os_error(error):
    """The OSError behind ``error``: torch's zip writer re-raises write errors as RuntimeError."""
    seen = error
    while seen is not None and not isinstance(seen, OSError):
        seen = seen.__cause__ or seen.__context__
    return seen


def _failure(path, error):
    os_error = _os_error(error)
    if os_error is not None and os_error.errno in errno.errorcode:
        cause = f"{os_error.strerror} ({errno.errorcode[os_error.errno]})"
    else:
        cause = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
    directory = os.path.dirname(os.path.abspath(path))
    return CheckpointError(f"{path}: checkpoint not saved: {cause}; the checkpoints already in {directory} are "
                           "intact and no partial file was left; fix the cause (e.g. free disk space) and rerun "
                           "(training resumes from checkpoint_last.pt)")


def _fsync_directory(directory):
    fd = os.open(directory or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _create_temporary(path):
    """A new file beside ``path`` under a name no one else holds: ``open(..., "xb")`` is O_CREAT|O_EXCL,
    which fails on any existing name, a planted symlink included, instead of following it."""
    for _ in range(100):
        tmp = f"{path}.{secrets.token_hex(4)}.tmp"
        try:
            return tmp, open(tmp, "xb")
        except FileExistsError:
            continue
    raise FileExistsError(f"{path}: no free temporary name beside it after 100 tries")


@contextlib.contextmanager
def atomic_write(path):
    """Yield a binary file; on success it becomes ``path`` in one rename, else ``path`` is untouched.

    The bytes go to a new file of a unique name in ``path``'s folder (so concurrent writers and
    names planted there are never written through), then ``os.replace`` puts it in place, which
    replaces a symlink standing at ``path`` rather than writing where it points. A failure
    (``ENOSPC``, ``EFBIG``, ``EDQUOT``, ...) removes the temporary file and raises
    :class:`CheckpointError`, one line naming the file and the cause.
    """
    tmp = None
    try:
        try:
            tmp, f = _create_temporary(path)
            with f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except Exception as e:  # the bytes never reached disk whole: report the file, not torch internals
            raise _failure(path, e) from None
        _fsync_directory(os.path.dirname(path))
    finally:
        if tmp is not None and os.path.lexists(tmp):
            os.remove(tmp)


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
