"""How fairseq groups sentences into batches.

``batch_by_size``: fairseq's ``batch_by_size`` keeps every index, as 0.12.2 does. fairseq's main branch
(hence fairseq-fixed, not 0.12.2) drops the last batch of
``batch_by_size`` whenever its size is not a multiple of ``--required-batch-size-multiple``:
``fairseq-generate`` then silently translates 24 of 30 test sentences and scores BLEU on
them, and validation skips sentences too. :func:`batch_by_size` puts that batch back.
"""
import numpy as np
from fairseq.data import data_utils

from fairseq_plugins.patches._mechanism import Patch, Target

BATCH_BY_SIZE = Target(data_utils, "batch_by_size", "indices, num_tokens_fn, num_tokens_vec, max_tokens, "
                       "max_sentences, required_batch_size_multiple, fixed_shapes")


def batch_by_size(indices, *args, **kwargs):
    """fairseq's batching, keeping every index (0.12.2's behaviour)."""
    batches = BATCH_BY_SIZE(indices, *args, **kwargs)
    covered = sum(len(b) for b in batches)
    if covered < len(indices):
        # The batches are consecutive runs of ``indices``: what is missing is the final run,
        # a batch fairseq had built (within --max-tokens/--batch-size) and then discarded.
        batches = list(batches) + [np.asarray(indices[covered:], dtype=np.int64)]
    return batches


def keeps_every_index():
    """Whether fairseq's own batching keeps 3 sentences in batches of 2 (a multiple of 2 required)."""
    indices = np.arange(3, dtype=np.int64)
    batches = BATCH_BY_SIZE(indices, num_tokens_fn=lambda i: 1, max_sentences=2, required_batch_size_multiple=2)
    return sum(len(b) for b in batches) == len(indices)


PATCHES = [Patch("batch_by_size", {BATCH_BY_SIZE: batch_by_size}, fixed_upstream=keeps_every_index)]
