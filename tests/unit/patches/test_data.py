"""patches/data.py: fairseq's batching with the behaviour out and the suite's with it in."""
import numpy as np
from fairseq.data import data_utils
from patching import OFFICIAL_0_12_2, out

from fairseq_plugins import patches


def test_batch_by_size():
    indices = np.arange(5, dtype=np.int64)

    def covered():
        batches = data_utils.batch_by_size(indices, num_tokens_fn=lambda i: 1, max_sentences=2,
                                           required_batch_size_multiple=2)
        return sorted(int(i) for b in batches for i in b)
    assert patches.PATCHES["batch_by_size"].installed != OFFICIAL_0_12_2  # 0.12.2 keeps every index itself
    if not OFFICIAL_0_12_2:
        with out("batch_by_size"):
            assert covered() == [0, 1, 2, 3]  # fairseq's main branch drops the last batch
    assert covered() == [0, 1, 2, 3, 4]
