"""Resuming a run: the same batches, the same place in the epoch, the same early-stopping state, and no
training past the end.

Behaviours (``FAIRSEQ_PLUGINS_DISABLE_PATCHES`` takes each name, or ``resume`` for all):

* ``resume_batches``: a run resumed in epoch e > 1 trains on the same batches as the run it continues.

  By default fairseq groups the training sentences into batches once per process and reuses
  them for every later epoch (``FairseqTask.get_batch_iterator`` caches its iterator). The
  grouping is seeded with ``seed + epoch`` of the *first* call: epoch 1 for an uninterrupted run,
  the checkpoint's epoch for a resumed one. Length ties are broken by that shuffle, so a run
  resumed in epoch 2 or later (at its start or in its middle) trains on differently composed
  batches -- the same sentences in other groups -- and ends elsewhere (measured: 6e-3 in the
  weights after 4 updates; fairseq's built-in ``transformer`` alike). The iterator state in the
  checkpoint was never the cause.

  Here a process that starts in epoch e > 1 builds the batches it will reuse as epoch 1 would
  (``seed + 1``), then moves the iterator to epoch e; so every process of a run, resumed or
  not, uses the same batches. The epoch's shuffling of the batch order (``seed + epoch`` in
  ``EpochBatchIterator``) is unchanged. Runs that rebuild batches each epoch
  (``--update-epoch-batch-itr True``, ``--disable-iterator-cache``, ``rebuild_batches``) were
  already exact and are left alone. fairseq 0.12.2 groups with ``seed`` alone, the same in every
  process, and is left alone too.

* ``elastic_resume``: resume an epoch on another number of workers or ``--update-freq``: every sample exactly once.

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

* ``finished_run``: a finished ``fairseq-train`` run stays finished: the same command again ends at once.

  fairseq's training loop takes an update before it compares the update count with
  ``--max-update``, so rerunning a command whose ``checkpoint_last.pt`` is at update N = --max-update
  (a pipeline script run twice, a job requeued after its final save, a worker killed between
  that save and its exit) trains update N+1 and overwrites ``checkpoint_last.pt`` and
  ``checkpoint_best.pt``. Here, right after fairseq has loaded the checkpoint and restored the
  train iterator, a run at or past ``--max-update``, or whose last completed epoch is ``--max-epoch``
  or later, prints one line (rank 0) and exits with status 0 before anything is written.

  Every rank decides from the state it has just loaded: rank 0's file, which ``Trainer.load_checkpoint``
  broadcast to the others (update count and iterator state alike), so all ranks stop together and no
  collective is left waiting.

* ``patience_state``: ``--patience`` survives a restart; a run that stopped early stays stopped.

  fairseq keeps early stopping's state (the best validation value and the count of validations
  since it improved) as attributes of the function ``fairseq_cli.train.should_stop_early``, in
  memory only (fairseq#3531): a run killed after two non-improving validations and resumed counts
  from zero again and stops ``--patience`` validations later than an uninterrupted run; a run that
  did stop early, started again with the same command, trains on. Here every checkpoint records
  that state (``extra_state["patience"]``) and a resume restores it. Where the restored count has
  reached ``--patience`` the run is over: rank 0 prints one line and every rank exits with status 0
  before anything is written (each decides from the state rank 0 read and broadcast).

``Trainer.save_checkpoint`` and ``checkpoint_utils.load_checkpoint``, which these and ``numerical``'s
behaviours change, are each replaced once (:mod:`fairseq_plugins.patches._shared`, where their order is).
"""
import hashlib
import logging
import math
import sys
from copy import copy

import fairseq_cli.train as fairseq_train
import numpy as np
from fairseq.data import FairseqDataset
from fairseq.data.iterators import EpochBatchIterator, ShardedIterator
from fairseq.tasks import FairseqTask
from fairseq.trainer import Trainer

from fairseq_plugins.patches._mechanism import Patch, Target
from fairseq_plugins.patches._shared import LOAD_CHECKPOINT, TRAINER_SAVE

logger = logging.getLogger(__name__)

# -- resume_batches ----------------------------------------------------------------------------------------------------

GET_BATCH_ITERATOR = Target(FairseqTask, "get_batch_iterator", (
    "self, dataset, max_tokens, max_sentences, max_positions, ignore_invalid_inputs, required_batch_size_multiple, "
    "seed, num_shards, shard_id, num_workers, epoch, data_buffer_size, disable_iterator_cache, skip_remainder_batch, "
    "grouped_shuffling, update_epoch_batch_itr"))
EPOCH_ITERATORS = Target(FairseqTask, "dataset_to_epoch_iter", instance=True)  # fairseq's cache of iterators


def get_batch_iterator(self, dataset, *args, epoch=1, **kwargs):
    cached = (not kwargs.get("disable_iterator_cache", False) and not kwargs.get("update_epoch_batch_itr", False)
              and not getattr(self.cfg, "rebuild_batches", False) and self.can_reuse_epoch_itr(dataset))
    if epoch <= 1 or not cached or dataset in self.dataset_to_epoch_iter:
        return GET_BATCH_ITERATOR(self, dataset, *args, epoch=epoch, **kwargs)
    iterator = GET_BATCH_ITERATOR(self, dataset, *args, epoch=1, **kwargs)  # batches grouped with seed + 1
    iterator.epoch = epoch
    dataset.set_epoch(epoch)
    return iterator


class _Ties(FairseqDataset):
    """Eight one-token sentences: every length ties, so the order is the seeded shuffle's."""

    def __len__(self):
        return 8

    def ordered_indices(self):
        return np.random.permutation(len(self))

    def num_tokens(self, index):
        return 1


def groups_by_starting_epoch():
    """Whether fairseq's batches depend on the epoch the iterator is first built in."""
    def batches(epoch):
        iterator = GET_BATCH_ITERATOR(FairseqTask(None), _Ties(), max_sentences=2, epoch=epoch,
                                      disable_iterator_cache=True)
        return [b.tolist() for b in iterator.frozen_batches]
    log = logging.getLogger(FairseqTask.__module__)  # fairseq logs each build at INFO level
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        return batches(1) != batches(2)
    finally:
        log.setLevel(level)


# -- elastic_resume ----------------------------------------------------------------------------------------------------

ORDERED_BATCHES = Target(EpochBatchIterator, "ordered_batches", "self, epoch, fix_batches_to_gpus, shuffle")
STATE_DICT = Target(EpochBatchIterator, "state_dict", "self")
LOAD_STATE_DICT = Target(EpochBatchIterator, "load_state_dict", "self, state_dict")
# The iterator's own state that a resume in the middle of an epoch reads and sets.
ITERATOR_READS = [
    Target(EpochBatchIterator, "_get_iterator_for_epoch", "self, epoch, shuffle, fix_batches_to_gpus, offset"),
    *(Target(EpochBatchIterator, name, instance=True)
      for name in ("_supports_prefetch", "_next_epoch_itr", "grouped_shuffling", "shuffle", "num_shards", "shard_id"))]

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


def save_update_freq(call, self, filename, extra_state):
    """fairseq's ``Trainer.save_checkpoint``; a mid-epoch iterator state also records --update-freq."""
    state = (extra_state or {}).get("train_iterator")
    if state is not None and CONSUMED in state:
        state["update_freq"] = _update_freq(self.cfg, state["epoch"])
    return call(self, filename, extra_state)


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


def say_how_the_epoch_goes_on(call, cfg, trainer, **passthrough_args):
    """fairseq's resume; then the line saying how a mid-epoch resume goes on."""
    extra_state, epoch_itr = call(cfg, trainer, **passthrough_args)
    resumed = _resumed(epoch_itr, epoch_itr.epoch) if isinstance(epoch_itr, EpochBatchIterator) else None
    if resumed is not None:
        logger.info(_resume_line(resumed, epoch_itr.num_shards, _update_freq(trainer.cfg, resumed.epoch)))
    return extra_state, epoch_itr


# -- finished_run ------------------------------------------------------------------------------------------------------

def _finished(cfg, trainer, epoch_itr):
    """The one line to print if the loaded run has nothing left to train, else None."""
    max_update = cfg.optimization.max_update or math.inf
    max_epoch = cfg.optimization.max_epoch or math.inf
    update = trainer.get_num_updates()
    if update >= max_update:
        return f"already trained to update {update}; nothing to do"
    if epoch_itr.next_epoch_idx > max_epoch:  # fairseq's own loop condition: no epoch would start
        return f"already trained to update {update}; nothing to do (--max-epoch {cfg.optimization.max_epoch} reached)"
    return None


def end_a_finished_run(call, cfg, trainer, **passthrough_args):
    """fairseq's resume; then the end of a run that is already finished."""
    extra_state, epoch_itr = call(cfg, trainer, **passthrough_args)
    # Only a training run's resume (not a fresh start, nor a caller with a stand-in trainer) can be finished.
    resumed_run = extra_state is not None and isinstance(trainer, Trainer)
    line = _finished(trainer.cfg, trainer, epoch_itr) if resumed_run else None
    if line is not None:
        if trainer.data_parallel_rank == 0:
            print(line, flush=True)
        sys.exit(0)
    return extra_state, epoch_itr


# -- patience_state ----------------------------------------------------------------------------------------------------

PATIENCE_STATE = "patience"
# fairseq keeps early stopping's state as attributes of this function, which it sets in its body
TRACKER = Target(fairseq_train, "should_stop_early", "cfg, valid_loss", holds="should_stop_early.num_runs")


def save_patience(call, self, filename, extra_state):
    """fairseq's ``Trainer.save_checkpoint``, with early stopping's state in ``extra_state``."""
    tracker = fairseq_train.should_stop_early  # the function fairseq's loop calls holds the state
    if extra_state is not None and getattr(tracker, "best", None) is not None:
        extra_state[PATIENCE_STATE] = {"best": float(tracker.best), "num_runs": int(tracker.num_runs)}
    return call(self, filename, extra_state)


def restore_patience(call, cfg, trainer, **passthrough_args):
    """fairseq's resume; then early stopping's state, and the end of a run that stopped early."""
    extra_state, epoch_itr = call(cfg, trainer, **passthrough_args)
    state = (extra_state or {}).get(PATIENCE_STATE) if isinstance(trainer, Trainer) else None
    if state is None:
        return extra_state, epoch_itr
    tracker = fairseq_train.should_stop_early
    tracker.best, tracker.num_runs = state["best"], state["num_runs"]
    patience = trainer.cfg.checkpoint.patience
    if 0 < patience <= state["num_runs"]:
        if trainer.data_parallel_rank == 0:
            print(f"already stopped early at update {trainer.get_num_updates()}: {state['num_runs']} validations "
                  f"without improving on {trainer.cfg.checkpoint.best_checkpoint_metric} {state['best']:g} "
                  f"(--patience {patience}); nothing to do", flush=True)
        sys.exit(0)
    return extra_state, epoch_itr


PATCHES = [
    Patch("resume_batches", {GET_BATCH_ITERATOR: get_batch_iterator}, reads=[EPOCH_ITERATORS],
          applies=groups_by_starting_epoch),
    Patch("elastic_resume", {ORDERED_BATCHES: ordered_batches, STATE_DICT: state_dict, LOAD_STATE_DICT: load_state_dict},
          reads=ITERATOR_READS, requires=("resume_batches",),
          steps={TRAINER_SAVE: save_update_freq, LOAD_CHECKPOINT: say_how_the_epoch_goes_on}),
    Patch("finished_run", steps={LOAD_CHECKPOINT: end_a_finished_run}),
    Patch("patience_state", reads=[TRACKER], steps={TRAINER_SAVE: save_patience, LOAD_CHECKPOINT: restore_patience}),
]
