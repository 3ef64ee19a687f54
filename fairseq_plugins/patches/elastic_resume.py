"""Resume an epoch on another number of workers or ``--update-freq``: every sample exactly once.

fairseq shuffles an epoch's batches into one global order, gives worker r of N the batches
r, r+N, r+2N, ... and records in the checkpoint only how many of its own batches a worker has
consumed. Update u of the epoch therefore consumes the global batches [u*G, (u+1)*G), G = N x
--update-freq; but a count of per-worker batches means nothing for another N: a run resumed on
other workers replayed some batches and skipped others (fairseq#3117).

Here a mid-epoch ``train_iterator`` state also records how many *global* batches were consumed,
how many there are and the sentences they hold, the layout that consumed them (workers,
``--update-freq``) and a SHA-1 of the epoch's global order. The order itself is not stored (it
is as long as the corpus): a resume rebuilds it from the seed, as fairseq does (the batches
themselves are the same in every process, see ``resume_batches``), checks the SHA-1, and shards
only the batches not yet consumed among the new workers, as fairseq shards a whole epoch. With
the same G (N x --update-freq = N' x --update-freq') every later update consumes the same global
batches as the uninterrupted run; with another G the updates group the remaining batches
differently, which one log line says. Where the rebuilt order differs (other data, other
--max-tokens or --seed) an exact position cannot be found: one warning line, and fairseq's
per-worker resume. Datasets that prefetch (``supports_prefetch``) keep fairseq's behaviour.
"""
import hashlib
import logging
from copy import copy

import numpy as np
from fairseq import checkpoint_utils
from fairseq.data.iterators import EpochBatchIterator, ShardedIterator
from fairseq.trainer import Trainer

from fairseq_plugins.patches._mechanism import Patch, Target

ORDERED_BATCHES = Target(EpochBatchIterator, "ordered_batches", "self, epoch, fix_batches_to_gpus, shuffle")
STATE_DICT = Target(EpochBatchIterator, "state_dict", "self")
LOAD_STATE_DICT = Target(EpochBatchIterator, "load_state_dict", "self, state_dict")
SAVE = Target(Trainer, "save_checkpoint", "self, filename, extra_state")
LOAD_CHECKPOINT = Target(checkpoint_utils, "load_checkpoint", "cfg, trainer, **passthrough_args")

logger = logging.getLogger(__name__)

CONSUMED = "global_batches_consumed"  # the key that marks a state written by this patch
ORDER = "_elastic_order"  # on an iterator: its cached _Order
RESUMED = "_elastic_resumed"  # on an iterator: the _Order of the epoch it resumed in, and where


class _Order:
    """One epoch's global batch order, as fairseq shuffles it, with what identifies it."""

    def __init__(self, iterator, epoch, shuffle, shards):
        self.epoch, self.shuffle, self.shards = epoch, shuffle, shards
        self.batches = _global_order(iterator, epoch, shuffle, shards)
        lengths = np.fromiter((len(b) for b in self.batches), dtype=np.int64, count=len(self.batches))
        self.samples_before = np.concatenate([[0], np.cumsum(lengths)])  # sentences in batches [0, i)
        sha = hashlib.sha1(lengths.tobytes())
        for batch in self.batches:
            sha.update(np.asarray(batch, dtype=np.int64).tobytes())
        self.sha1 = sha.hexdigest()
        self.base = 0  # global batches consumed before this process's sharding started

    def key(self):
        return self.epoch, self.shuffle, self.shards


def _global_order(iterator, epoch, shuffle, shards):
    """fairseq's order of the epoch's batches before sharding: its shard lists, interleaved.

    ``shards``: the worker count the order was shuffled for; it matters only with
    ``--grouped-shuffling`` (groups of one batch per worker), so it is 1 otherwise.
    """
    view = copy(iterator)  # the same batches, seen as each shard of ``shards``
    view.num_shards, lists = shards, []
    for shard in range(shards):
        view.shard_id = shard
        lists.append(ORDERED_BATCHES(view, epoch, False, shuffle))
    return [batch for group in zip(*lists) for batch in group if len(batch)]  # fairseq pads shards with []


def _order(iterator, epoch, shuffle, shards):
    cached = vars(iterator).get(ORDER)
    if cached is None or cached.key() != (epoch, shuffle, shards):
        cached = vars(iterator)[ORDER] = _Order(iterator, epoch, shuffle, shards)
    return cached


def _resumed(iterator, epoch):
    """The _Order of ``epoch`` if this iterator resumed inside it, else None."""
    resumed = vars(iterator).get(RESUMED)
    return resumed if resumed is not None and resumed.epoch == epoch else None


def ordered_batches(self, epoch, fix_batches_to_gpus, shuffle):
    """fairseq's shard of the epoch; in a resumed epoch, this worker's shard of what remains."""
    resumed = _resumed(self, epoch)
    if resumed is None:
        return ORDERED_BATCHES(self, epoch, fix_batches_to_gpus, shuffle)
    return list(ShardedIterator(resumed.batches[resumed.base:], self.num_shards, self.shard_id, fill_value=[]))


def state_dict(self):
    state = STATE_DICT(self)
    resumed = _resumed(self, self.epoch)
    local = self.iterations_in_epoch
    if self._supports_prefetch or state["epoch"] != self.epoch or (local == 0 and resumed is None):
        return state  # at an epoch boundary fairseq's state is exact for any number of workers
    order = resumed or _order(self, self.epoch, self.shuffle, self.num_shards if self.grouped_shuffling else 1)
    consumed = min(order.base + local * self.num_shards, len(order.batches))  # every worker takes one per step
    state.update({
        "iterations_in_epoch": consumed // self.num_shards,  # fairseq's own field, for the same number of workers
        CONSUMED: consumed, "global_batches": len(order.batches),
        "samples_consumed": int(order.samples_before[consumed]), "samples": int(order.samples_before[-1]),
        "num_shards": self.num_shards, "order_shards": order.shards, "order_sha1": order.sha1,
    })
    return state


def load_state_dict(self, state):
    if CONSUMED not in state or self._supports_prefetch:
        return LOAD_STATE_DICT(self, state)
    shuffle = state.get("shuffle", True)
    order = _Order(self, state["epoch"], shuffle, state["order_shards"])
    if order.sha1 != state["order_sha1"]:
        logger.warning(
            "the checkpoint's epoch %d was shuffled into other batches than this run makes (other data, "
            "--max-tokens, --seed or batching flags): its position cannot be found exactly; resuming at batch %d "
            "of each worker as fairseq does, so some batches of this epoch may be seen twice or not at all",
            state["epoch"], state["iterations_in_epoch"])
        return LOAD_STATE_DICT(self, state)
    order.base = state[CONSUMED]
    order.written_by = state["num_shards"], state.get("update_freq")
    vars(self)[RESUMED] = order
    self.epoch = order.epoch
    self._next_epoch_itr = self._get_iterator_for_epoch(order.epoch, shuffle=shuffle, offset=0)


def _update_freq(cfg, epoch):
    """The --update-freq of ``epoch`` (fairseq's per-epoch list, its last value repeated)."""
    update_freq = cfg.optimization.update_freq
    return update_freq[min(epoch, len(update_freq)) - 1]


def save_checkpoint(self, filename, extra_state):
    """fairseq's ``Trainer.save_checkpoint``; a mid-epoch iterator state also records --update-freq."""
    state = (extra_state or {}).get("train_iterator")
    if state is not None and CONSUMED in state:
        state["update_freq"] = _update_freq(self.cfg, state["epoch"])
    return SAVE(self, filename, extra_state)


def _workers(n, update_freq):
    return f"{n} worker{'s' if n != 1 else ''} x --update-freq {update_freq}"


def _resume_line(order, workers, update_freq):
    """The one line that says where the epoch is resumed and how its rest is split."""
    total, consumed = len(order.batches), order.base
    old_workers, old_update_freq = order.written_by
    line = (f"resumed epoch {order.epoch} after {consumed} of its {total} global batches "
            f"({order.samples_before[consumed]} of {order.samples_before[-1]} sentences), written by "
            f"{_workers(old_workers, old_update_freq if old_update_freq is not None else '?')}; the remaining "
            f"{total - consumed} batches are split among {_workers(workers, update_freq)}")
    per_update, old_per_update = workers * update_freq, None if old_update_freq is None else old_workers * old_update_freq
    if per_update == old_per_update:
        return line + f", {per_update} per update as before: the same global batches as an uninterrupted run"
    return line + (f", {per_update} per update instead of {old_per_update if old_per_update else 'an unknown count'}: "
                   "an exact continuation is impossible (the updates group other batches); every remaining "
                   "sentence of the epoch is still seen once")


def load_checkpoint(cfg, trainer, **passthrough_args):
    """fairseq's resume; then the line saying how a mid-epoch resume goes on."""
    extra_state, epoch_itr = LOAD_CHECKPOINT(cfg, trainer, **passthrough_args)
    resumed = _resumed(epoch_itr, epoch_itr.epoch) if isinstance(epoch_itr, EpochBatchIterator) else None
    if resumed is not None:
        logger.info(_resume_line(resumed, epoch_itr.num_shards, _update_freq(trainer.cfg, resumed.epoch)))
    return extra_state, epoch_itr


PATCH = Patch(__name__, {ORDERED_BATCHES: ordered_batches, STATE_DICT: state_dict, LOAD_STATE_DICT: load_state_dict,
                         SAVE: save_checkpoint, LOAD_CHECKPOINT: load_checkpoint}, requires=("resume_batches",))
