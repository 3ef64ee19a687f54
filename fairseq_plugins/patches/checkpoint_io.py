"""Checkpoint files: written whole, read weights-only, sent to the other workers as safely.

Behaviours (``FAIRSEQ_PLUGINS_DISABLE_PATCHES`` takes each name, or ``checkpoint_io`` for all):

* ``atomic_checkpoints``: every checkpoint file fairseq writes is complete or absent, and a failed
  save says so. fairseq's ``save_checkpoint`` writes the first file of a save with
  ``torch_persistent_save`` (``X.tmp``, then rename, no fsync) and makes every other name of
  that save (``checkpoint_best.pt``, ``checkpoint_last.pt``) with ``PathManager.copy``, a plain
  ``shutil.copyfile``: a process killed during that copy leaves a truncated ``checkpoint_last.pt``,
  the very file the next ``fairseq-train`` resumes from; a full disk ends in a traceback from
  inside torch's zip writer. Here both write through :func:`~fairseq_plugins.checkpoints.atomic_write`
  (a unique temporary name, fsync, ``os.replace``, fsync of the folder); a failed save
  (``ENOSPC``, ``EFBIG``, ``EDQUOT``, ...) is one :class:`~fairseq_plugins.errors.CheckpointError`
  line. Paths served by iopath handlers (``manifold://``, ``s3://``) and asynchronous writes keep
  fairseq's own behaviour.
* ``checkpoint_loading``: fairseq loads its own checkpoints under torch >= 2.6, weights-only on
  every torch version. torch >= 2.6 loads with ``weights_only=True`` by default, and fairseq's
  ``load_checkpoint_to_cpu`` then fails on the ``argparse.Namespace`` every fairseq checkpoint
  holds. The classes fairseq checkpoints contain are allowed (``add_safe_globals``), fairseq's
  loaders (``load_checkpoint_to_cpu``, ``load_ema_from_checkpoint``) load weights-only on older
  torch too (2.4, 2.5), and a refused, truncated or foreign file (a bare ``state_dict()``) is one
  :class:`~fairseq_plugins.errors.CheckpointError` line naming the file.
* ``broadcast_state``: ranks > 0 receive a resumed checkpoint as safely as rank 0 reads it. Only
  rank 0 reads the file; the others get the state from ``broadcast_object``, whose
  ``_broadcast_object_slow`` unpickles with a plain ``torch.load``, weights-only under torch >= 2.6,
  which refuses the ``DictConfig`` of ``state["cfg"]`` and fairseq's ``_TensorPlaceholder``: every
  multi-worker resume died on rank 1. Here the sender turns each ``DictConfig`` into plain
  containers inside a :class:`Config` marker and the receiver loads weights-only with the
  checkpoint allowlist plus these two classes (turning weights-only off would let rank 0's bytes
  run code on every worker).
"""
import dataclasses
import inspect
import shutil

import torch
from fairseq import checkpoint_utils
from fairseq.distributed import utils as distributed_utils
from fairseq.file_io import PathManager
from omegaconf import DictConfig, OmegaConf

from fairseq_plugins.checkpoints import (FAIRSEQ_CHECKPOINT_GLOBALS, TORCH_LOAD, allowing, atomic_write, load_with,
                                         refused, weights_only_torch_load)
from fairseq_plugins.errors import CheckpointError
from fairseq_plugins.patches._mechanism import Patch, Target

# -- atomic_checkpoints ----------------------------------------------------------------------------------------------

SAVE = Target(checkpoint_utils, "torch_persistent_save", "obj, filename, async_write")
PATH_MANAGER = Target(checkpoint_utils, "PathManager")


def torch_persistent_save(obj, filename, async_write=False):
    """fairseq's ``torch_persistent_save``, atomic and durable for local paths."""
    if async_write or not isinstance(filename, str) or PathManager.path_requires_pathmanager(filename):
        return SAVE(obj, filename, async_write=async_write)
    with atomic_write(filename) as f:
        torch.save(obj, f)


class AtomicPathManager(PathManager):
    """fairseq's ``PathManager`` whose ``copy`` renames a complete file into place."""

    @staticmethod
    def copy(src_path, dst_path, overwrite=False):
        if PathManager.path_requires_pathmanager(dst_path):
            return PathManager.copy(src_path, dst_path, overwrite=overwrite)
        with atomic_write(dst_path) as dst, open(src_path, "rb") as src:
            shutil.copyfileobj(src, dst)
        return True


# -- checkpoint_loading ----------------------------------------------------------------------------------------------

LOAD = Target(checkpoint_utils, "load_checkpoint_to_cpu", "path, arg_overrides, load_on_all_ranks")
LOAD_EMA = Target(checkpoint_utils, "load_ema_from_checkpoint", "fpath")


def load_checkpoint_to_cpu(path, *args, **kwargs):
    """fairseq's loader, weights-only on every torch version, with one-line errors."""
    return load_with(LOAD, path, *args, **kwargs)


def load_ema_from_checkpoint(path):
    """fairseq's EMA loader (``torch.load`` of its own), weights-only too."""
    with weights_only_torch_load(refused):
        return LOAD_EMA(path)


# -- broadcast_state -------------------------------------------------------------------------------------------------

_HAS_FLAGS = "flags" in inspect.signature(OmegaConf.create).parameters
BROADCAST = Target(distributed_utils, "_broadcast_object_slow", "obj, src_rank, group, dist_device")
PLACEHOLDER = Target(distributed_utils, "_TensorPlaceholder")  # what fairseq puts in place of each tensor


@dataclasses.dataclass(frozen=True)
class Config:
    """An omegaconf config on the wire, as plain containers."""

    container: dict


def _map(obj, leaf):
    """``obj`` with ``leaf`` applied to every value inside dicts, lists and tuples (as fairseq walks it)."""
    if isinstance(obj, dict):
        return {k: _map(v, leaf) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map(v, leaf) for v in obj) if type(obj) in (list, tuple) else obj
    return leaf(obj)


def _plain(obj):
    return Config(OmegaConf.to_container(obj, resolve=False)) if isinstance(obj, DictConfig) else obj


def _restored(obj):
    """As load_checkpoint_to_cpu makes it: with ``allow_objects`` where omegaconf has flags (>= 2.1);
    omegaconf 2.0 (beside fairseq 0.12.2) has none, and the suite's configs are plain containers."""
    if not isinstance(obj, Config):
        return obj
    return OmegaConf.create(obj.container, **({"flags": {"allow_objects": True}} if _HAS_FLAGS else {}))


def _broadcast_refused(buffer, e):
    return CheckpointError(f"the state broadcast by rank 0 was refused by the weights-only loader "
                           f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")


def broadcast_object_slow(obj, src_rank, group, dist_device):
    """fairseq's pickle broadcast, loaded weights-only on the receiving ranks."""
    sending = distributed_utils.get_rank(group) == src_rank
    with weights_only_torch_load(_broadcast_refused):  # fairseq's function calls torch.load by name
        received = BROADCAST(_map(obj, _plain) if sending else None, src_rank, group, dist_device)
    return obj if sending else _map(received, _restored)


_load_setup, _load_teardown = allowing(FAIRSEQ_CHECKPOINT_GLOBALS)
# Where fairseq lacks _TensorPlaceholder, PLACEHOLDER keeps broadcast_state out (with one line naming it).
_broadcast_setup, _broadcast_teardown = allowing(
    [Config] + ([distributed_utils._TensorPlaceholder] if PLACEHOLDER.problem() is None else []))

PATCHES = [
    Patch("atomic_checkpoints", {SAVE: torch_persistent_save, PATH_MANAGER: AtomicPathManager}),
    Patch("checkpoint_loading", {LOAD: load_checkpoint_to_cpu, LOAD_EMA: load_ema_from_checkpoint},
          scoped=[TORCH_LOAD], setup=_load_setup, teardown=_load_teardown),
    # requires checkpoint_loading: the allowlist of a checkpoint's classes is its
    Patch("broadcast_state", {BROADCAST: broadcast_object_slow}, requires=["checkpoint_loading"],
          scoped=[TORCH_LOAD], reads=[PLACEHOLDER], setup=_broadcast_setup, teardown=_broadcast_teardown),
]
