"""Ranks > 0 receive a resumed checkpoint as safely as rank 0 reads it.

In ``Trainer.load_checkpoint`` only rank 0 reads the file (through the suite's weights-only
loader); the other ranks get the state from ``fairseq.distributed.utils.broadcast_object``,
whose ``_broadcast_object_slow`` unpickles the bytes with a plain ``torch.load``. Under
torch >= 2.6 that load is weights-only and refuses what fairseq put there: the
``omegaconf`` ``DictConfig`` of ``state["cfg"]`` and fairseq's ``_TensorPlaceholder``; so every
multi-worker resume died on rank 1. (Turning weights-only off would let rank 0's bytes run
code on every worker.)

Here the sender turns each ``DictConfig`` into plain containers inside a :class:`Config`
marker, the receiver loads the bytes weights-only with the checkpoint allowlist plus these
two data classes, and rebuilds the ``DictConfig`` as fairseq's loader makes it.
"""
import dataclasses
import inspect

from fairseq.distributed import utils as distributed_utils
from omegaconf import DictConfig, OmegaConf

from fairseq_plugins.errors import CheckpointError
from fairseq_plugins.patches._mechanism import Patch, Target
from fairseq_plugins.patches._weights_only import TORCH_LOAD, allowing, weights_only_torch_load

_HAS_FLAGS = "flags" in inspect.signature(OmegaConf.create).parameters
BROADCAST = Target(distributed_utils, "_broadcast_object_slow", "obj, src_rank, group, dist_device")


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


def _refused(buffer, e):
    return CheckpointError(f"the state broadcast by rank 0 was refused by the weights-only loader "
                           f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")


def broadcast_object_slow(obj, src_rank, group, dist_device):
    """fairseq's pickle broadcast, loaded weights-only on the receiving ranks."""
    sending = distributed_utils.get_rank(group) == src_rank
    with weights_only_torch_load(_refused):  # fairseq's function calls torch.load by name; only receivers reach it
        received = BROADCAST(_map(obj, _plain) if sending else None, src_rank, group, dist_device)
    return obj if sending else _map(received, _restored)


_setup, _teardown = allowing([Config, distributed_utils._TensorPlaceholder])
# requires checkpoint_loading: the allowlist of a checkpoint's classes is its
PATCH = Patch(__name__, {BROADCAST: broadcast_object_slow}, requires=["checkpoint_loading"], scoped=[TORCH_LOAD],
              setup=_setup, teardown=_teardown)
