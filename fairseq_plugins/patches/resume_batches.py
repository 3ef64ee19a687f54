"""A run resumed in epoch e > 1 trains on the same batches as the run it continues.

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
"""
import logging

import numpy as np
from fairseq.data import FairseqDataset
from fairseq.tasks import FairseqTask

from fairseq_plugins.patches._mechanism import Patch, Target

GET_BATCH_ITERATOR = Target(FairseqTask, "get_batch_iterator", (
    "self, dataset, max_tokens, max_sentences, max_positions, ignore_invalid_inputs, required_batch_size_multiple, "
    "seed, num_shards, shard_id, num_workers, epoch, data_buffer_size, disable_iterator_cache, skip_remainder_batch, "
    "grouped_shuffling, update_epoch_batch_itr"))


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


PATCH = Patch(__name__, {GET_BATCH_ITERATOR: get_batch_iterator}, applies=groups_by_starting_epoch)
