"""The patches batch_by_size (patches/data.py) and checkpoint_loading (patches/checkpoint_io.py): batching keeps
every sentence; checkpoints load weights-only."""
import os

import numpy as np
import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.data import data_utils

import fairseq_plugins  # noqa: F401  (installs the patches)
from fairseq_plugins.checkpoints import save_state
from fairseq_plugins.errors import CheckpointError


@pytest.mark.parametrize("n, bsz, mult", [(30, 16, 8), (30, 7, 8), (5, 16, 8), (64, 16, 8), (17, 4, 1)])
def test_batch_by_size_keeps_every_index(n, bsz, mult):
    indices = np.random.RandomState(0).permutation(n)
    batches = data_utils.batch_by_size(indices, lambda i: 10, max_sentences=bsz, required_batch_size_multiple=mult)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(n))
    assert flat.tolist() == indices.tolist()  # order kept: batches are consecutive runs
    assert max(len(b) for b in batches) <= bsz


def test_batch_by_size_respects_max_tokens():
    lengths = np.array([3, 9, 4, 12, 7, 7, 2, 11, 5])
    indices = np.argsort(lengths, kind="stable")
    batches = data_utils.batch_by_size(indices, lambda i: int(lengths[i]), max_tokens=24,
                                       required_batch_size_multiple=2)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(lengths)))
    for b in batches:
        assert len(b) * max(lengths[b]) <= 24


class Marker:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_weights_only_loading(tmp_path):
    import argparse

    good = {"args": None, "model": {"w": torch.ones(2)}, "cfg": None,
            "optimizer_history": [{"criterion_name": "x", "optimizer_name": "x", "lr_scheduler_state": {},
                                   "num_updates": 3}], "extra_state": {"val_loss": np.float64(1.5), "legacy_args": argparse.Namespace(arch="x")}}
    save_state(good, str(tmp_path / "good.pt"))
    state = checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "good.pt"))
    assert torch.equal(state["model"]["w"], torch.ones(2))

    marker = tmp_path / "ran"
    torch.save({"model": {}, "x": Marker(marker)}, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError, match="evil.pt: refused to load: it needs posix.system"):
        checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "evil.pt"))
    assert not marker.exists()

    (tmp_path / "short.pt").write_bytes((tmp_path / "good.pt").read_bytes()[:300])
    with pytest.raises(CheckpointError, match="short.pt: not a readable checkpoint"):
        checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "short.pt"))
    assert torch.load is torch.serialization.load  # the weights-only wrapper is not left behind
