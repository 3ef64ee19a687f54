"""fairseq's ``batch_by_size`` keeps every index, as 0.12.2 does.

fairseq's main branch (hence fairseq-fixed, not 0.12.2) drops the last batch of
``batch_by_size`` whenever its size is not a multiple of ``--required-batch-size-multiple``:
``fairseq-generate`` then silently translates 24 of 30 test sentences and scores BLEU on
them, and validation skips sentences too. :func:`batch_by_size` puts that batch back.
"""
import numpy as np
from fairseq.data import data_utils


def batch_by_size(indices, *args, _fairseq_batch_by_size=data_utils.batch_by_size, **kwargs):
    """fairseq's batching, keeping every index (0.12.2's behaviour)."""
    batches = _fairseq_batch_by_size(indices, *args, **kwargs)
    covered = sum(len(b) for b in batches)
    if covered < len(indices):
        # The batches are consecutive runs of ``indices``: what is missing is the final run,
        # a batch fairseq had built (within --max-tokens/--batch-size) and then discarded.
        batches = list(batches) + [np.asarray(indices[covered:], dtype=np.int64)]
    return batches


def install():
    data_utils.batch_by_size = batch_by_size
