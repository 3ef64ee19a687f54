"""patches/checkpoint_io.py: fairseq's checkpoint reads and writes with each behaviour out, the suite's with it in."""
import os
import re
import threading
import types

import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.distributed import utils as distributed_utils
from omegaconf import OmegaConf
from patching import out

from fairseq_plugins.errors import CheckpointError


def test_checkpoint_loading(tmp_path):
    path = tmp_path / "not_a_checkpoint.pt"
    path.write_bytes(b"PK\x03\x04 truncated")
    with out("checkpoint_loading"):
        with pytest.raises(Exception) as fairseq_error:
            checkpoint_utils.load_checkpoint_to_cpu(str(path))
        assert not isinstance(fairseq_error.value, CheckpointError)
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(path))}: not a readable checkpoint"):
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    # a torch file that is no fairseq checkpoint (a bare state_dict()): fairseq's upgrade raises a KeyError
    state_dict = tmp_path / "state_dict.pt"
    torch.save({"encoder.w": torch.ones(2)}, state_dict)
    with out("checkpoint_loading"):
        with pytest.raises(KeyError):
            checkpoint_utils.load_checkpoint_to_cpu(str(state_dict))
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(state_dict))}: not a fairseq checkpoint \(no 'model'"):
        checkpoint_utils.load_checkpoint_to_cpu(str(state_dict))


def test_the_weights_only_window_keeps_other_loads_and_later_wrappers(tmp_path):
    """A torch.load wrapper installed after the suite is called during fairseq's load and still there after;
    another thread's torch.load in that window is not made weights-only."""
    path = tmp_path / "state.pt"
    torch.save({"model": {}, "obj": types.SimpleNamespace(a=1)}, path)  # a class no allowlist holds
    calls, seen = [], {}
    real = torch.load

    def wrapper(f, *args, **kwargs):
        calls.append(kwargs.get("weights_only"))
        if threading.current_thread() is threading.main_thread():
            other = threading.Thread(target=lambda: seen.update(other=real_load_through_torch(path)))
            other.start()
            other.join()
        return real(f, *args, **kwargs)

    def real_load_through_torch(p):
        return torch.load(p, weights_only=False)["obj"].a

    torch.load = wrapper
    try:
        with pytest.raises(CheckpointError, match="SimpleNamespace"):
            checkpoint_utils.load_checkpoint_to_cpu(str(path))
        assert torch.load is wrapper
    finally:
        torch.load = real
    assert calls[0] is True and seen == {"other": 1}


def test_broadcast_state(monkeypatch):
    """rank 1's side of fairseq's pickle broadcast: a DictConfig arrives (fairseq's refuses it under torch >= 2.6)."""
    state = {"cfg": OmegaConf.create({"model": {"dropout": 0.1}}), "n": 3}
    wire = []

    def broadcast(tensor, src, group=None):
        if sending[0]:
            wire.append(tensor.clone())
        else:
            tensor.copy_(wire.pop(0))

    monkeypatch.setattr(distributed_utils, "broadcast", broadcast)

    def send_then_receive():
        wire.clear()
        sending[0] = True
        monkeypatch.setattr(distributed_utils, "get_rank", lambda group: 0)
        distributed_utils._broadcast_object_slow(state, 0, None, torch.device("cpu"))
        sending[0] = False
        monkeypatch.setattr(distributed_utils, "get_rank", lambda group: 1)
        return distributed_utils._broadcast_object_slow(None, 0, None, torch.device("cpu"))
    sending = [True]
    with out("broadcast_state"):
        with pytest.raises(Exception, match="Weights only load failed"):
            send_then_receive()
    received = send_then_receive()
    assert received["n"] == 3 and received["cfg"].model.dropout == 0.1


def test_atomic_checkpoints(tmp_path):
    path = str(tmp_path / "checkpoint_last.pt")
    unpicklable = {"f": lambda: 0}
    with out("atomic_checkpoints"):
        with pytest.raises(Exception):
            checkpoint_utils.torch_persistent_save(unpicklable, path)
        assert os.listdir(tmp_path) == ["checkpoint_last.pt.tmp"]  # fairseq leaves the half-written file
        os.remove(path + ".tmp")
    with pytest.raises(Exception):
        checkpoint_utils.torch_persistent_save(unpicklable, path)
    assert os.listdir(tmp_path) == []
