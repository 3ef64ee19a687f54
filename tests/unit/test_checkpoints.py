"""fairseq_plugins/checkpoints.py on small files written by the test: which checkpoints
``fairseq-plugins-average`` picks, the mean it writes (float64 sums written out here, ties kept),
and the one-line refusals. The end-to-end average of a real training is in test_end_to_end.py."""
import os
import zipfile

import pytest
import torch
from fairseq.dataclass.constants import DDP_BACKEND_CHOICES
from omegaconf import OmegaConf

from fairseq_plugins.checkpoints import (EPOCH_PATTERN, UPDATE_PATTERN, average_states, averaging_window,
                                         checkpoint_paths, is_encoder_fast_path_copy, last_checkpoints,
                                         load_state, save_state)
from fairseq_plugins.errors import CheckpointError, ConfigError


def write(path, model, extra=None):
    """A checkpoint as fairseq lays one out, holding ``model``."""
    torch.save({"model": model, "cfg": None, "extra_state": extra or {}, "last_optimizer_state": {"step": 1},
                "optimizer_history": [{"criterion_name": "x", "best_loss": None}]}, path)
    return str(path)


def touch(directory, *names):
    for name in names:
        (directory / name).touch()
    return str(directory)


def test_last_checkpoints_sorts_by_number_and_honours_the_upper_bound(tmp_path):
    d = touch(tmp_path, "checkpoint_1_9.pt", "checkpoint_1_10.pt", "checkpoint_2_100.pt", "checkpoint_last.pt",
              "checkpoint9.pt", "checkpoint10.pt", "checkpoint_best.pt", "checkpoint_1_20.pt.tmp")
    names = lambda paths: [os.path.basename(p) for p in paths]  # noqa: E731
    assert names(last_checkpoints(d, 2, UPDATE_PATTERN)) == ["checkpoint_1_10.pt", "checkpoint_2_100.pt"]
    assert names(last_checkpoints(d, 3, UPDATE_PATTERN)) == ["checkpoint_1_9.pt", "checkpoint_1_10.pt",
                                                             "checkpoint_2_100.pt"]
    assert names(last_checkpoints(d, 2, EPOCH_PATTERN)) == ["checkpoint9.pt", "checkpoint10.pt"]
    # the bound is inclusive
    assert names(last_checkpoints(d, 2, UPDATE_PATTERN, upper_bound=10)) == ["checkpoint_1_9.pt", "checkpoint_1_10.pt"]
    assert names(last_checkpoints(d, 1, EPOCH_PATTERN, upper_bound=9)) == ["checkpoint9.pt"]


@pytest.mark.parametrize("pattern, kind, found", [(UPDATE_PATTERN, "update", 3), (EPOCH_PATTERN, "epoch", 2)])
def test_last_checkpoints_says_how_many_it_found(tmp_path, pattern, kind, found):
    d = touch(tmp_path, "checkpoint_1_9.pt", "checkpoint_1_10.pt", "checkpoint_2_100.pt", "checkpoint9.pt",
              "checkpoint10.pt")
    with pytest.raises(ConfigError) as error:
        last_checkpoints(d, 4, pattern)
    assert str(error.value) == f"{d}: asked for the last 4 {kind} checkpoints, found {found}"
    with pytest.raises(ConfigError, match=f"found {found - 1}$"):
        last_checkpoints(d, found, pattern, upper_bound=99 if kind == "update" else 9)


def test_averaging_window_is_open_below_and_closed_above(tmp_path):
    d = touch(tmp_path, *(f"checkpoint_1_{u}.pt" for u in (10, 20, 30, 40)), "checkpoint3.pt")
    window = lambda *args: [int(p.rsplit("_", 1)[1][:-3]) for p in averaging_window(d, *args)]  # noqa: E731
    assert window(5, 40, 0.5) == [30, 40]  # low = 20 is left out, 40 = the updates done is in
    assert window(1, 40, 0.5) == [40]
    assert window(5, 35, 0.5) == [20, 30]  # nothing after the updates done
    assert window(5, 40, 1.0) == [10, 20, 30, 40]
    assert [os.path.basename(p) for p in averaging_window(d, 5, 3, 1.0, EPOCH_PATTERN)] == ["checkpoint3.pt"]


def test_checkpoint_paths_takes_files_or_the_last_n_of_one_directory(tmp_path):
    d = touch(tmp_path, "checkpoint1.pt", "checkpoint2.pt", "checkpoint_1_5.pt", "checkpoint_2_8.pt")
    files = [f"{d}/checkpoint2.pt", f"{d}/checkpoint1.pt"]
    assert checkpoint_paths(files) == files  # as given, in the given order
    assert checkpoint_paths([d], num_epoch_checkpoints=1) == [f"{d}/checkpoint2.pt"]
    assert checkpoint_paths([d], num_update_checkpoints=2) == [f"{d}/checkpoint_1_5.pt", f"{d}/checkpoint_2_8.pt"]
    assert checkpoint_paths([d], num_update_checkpoints=1, upper_bound=5) == [f"{d}/checkpoint_1_5.pt"]


@pytest.mark.parametrize("inputs, counts, message", [
    (["{d}/checkpoint1.pt", "{d}/nothing.pt"], {}, "{d}/nothing.pt: no such checkpoint file"),
    (["{d}"], {}, "{d}: no such checkpoint file"),  # a directory without --num-*-checkpoints
    (["{d}"], {"num_update_checkpoints": 0}, "asked to average 0 checkpoints: need at least 1"),
    (["{d}"], {"num_epoch_checkpoints": -2}, "asked to average -2 checkpoints: need at least 1"),
    (["{d}/checkpoint1.pt"], {"num_epoch_checkpoints": 1},
     "{d}/checkpoint1.pt: --num-*-checkpoints needs exactly one checkpoint directory"),
    (["{d}", "{d}"], {"num_epoch_checkpoints": 1}, "{d} {d}: --num-*-checkpoints needs exactly one checkpoint directory"),
    ([], {"num_epoch_checkpoints": 1}, ": --num-*-checkpoints needs exactly one checkpoint directory"),
])
def test_checkpoint_paths_refuses_in_one_line(tmp_path, inputs, counts, message):
    d = touch(tmp_path, "checkpoint1.pt")
    with pytest.raises(ConfigError) as error:
        checkpoint_paths([i.format(d=d) for i in inputs], **counts)
    assert str(error.value) == message.format(d=d)


def test_average_is_the_float64_mean_whatever_the_order(tmp_path):
    """In float32, (1e8 + 1) - 1e8 is 0 and (1e8 - 1e8) + 1 is 1: a mean summed in the inputs'
    precision depends on their order; the float64 sum gives 1/3 for every order."""
    values = [1e8, 1.0, -1e8]
    paths = [write(tmp_path / f"c{i}.pt", {"w": torch.tensor([v, 2.0 * i], dtype=torch.float32),
                                          "h": torch.tensor([v], dtype=torch.float16).clamp(-1e4, 1e4),
                                          "step": torch.tensor(i)})
             for i, v in enumerate(values)]
    expected_w = torch.tensor([sum(values) / 3, 2.0], dtype=torch.float64).float()
    for order in ([0, 1, 2], [0, 2, 1], [2, 0, 1]):
        model = average_states([paths[i] for i in order])["model"]
        assert model["w"].dtype == torch.float32 and torch.equal(model["w"], expected_w), (order, model["w"])
        assert model["h"].dtype == torch.float16
        assert torch.equal(model["h"], torch.tensor([(1e4 + 1 - 1e4) / 3], dtype=torch.float64).half())
        assert model["step"].dtype == torch.int64 and model["step"].item() == 1  # (0 + 1 + 2) / 3


def test_average_keeps_the_newest_inputs_other_entries_and_drops_the_optimizer(tmp_path):
    paths = [write(tmp_path / f"c{i}.pt", {"w": torch.full((2,), float(i))}, extra={"which": i}) for i in range(3)]
    state = average_states(paths)
    assert state["extra_state"]["which"] == 2  # the last path given
    assert state["last_optimizer_state"] is None
    assert torch.equal(state["model"]["w"], torch.ones(2))
    assert average_states(paths[:1])["model"]["w"].equal(torch.zeros(2))  # one input: itself


def test_average_keeps_tied_weights_tied_and_views_apart(tmp_path):
    def model(scale):
        shared, block = torch.full((3, 2), scale), torch.arange(6.0).view(3, 2) * scale
        return {"enc": shared, "dec": shared, "out": shared, "block": block, "row": block[1], "col": block.t()}

    paths = [write(tmp_path / f"c{s}.pt", model(s)) for s in (1.0, 3.0)]
    averaged = average_states(paths)["model"]
    storage = lambda name: averaged[name].untyped_storage().data_ptr()  # noqa: E731
    assert storage("enc") == storage("dec") == storage("out")
    for name, tensor in model(2.0).items():  # the mean of scales 1 and 3
        assert torch.equal(averaged[name], tensor), name
    assert len({storage(n) for n in ("block", "row", "col")}) == 3  # views are not ties: averaged on their own
    save_state({"model": averaged}, str(tmp_path / "avg.pt"))
    with zipfile.ZipFile(tmp_path / "avg.pt") as f:
        assert sum("/data/" in name for name in f.namelist()) == 4  # shared, block, row, col


@pytest.mark.parametrize("other, first", [
    ({"a": torch.zeros(2), "b": torch.zeros(3)}, "b"),  # a shape
    ({"a": torch.zeros(2), "c": torch.zeros(2)}, "b"),  # a name
    ({"a": torch.zeros(2)}, "b"),  # one missing
])
def test_average_refuses_another_architecture_naming_the_first_difference(tmp_path, other, first):
    good = write(tmp_path / "good.pt", {"a": torch.zeros(2), "b": torch.zeros(2)})
    bad = write(tmp_path / "bad.pt", other)
    with pytest.raises(CheckpointError) as error:
        average_states([good, bad])
    assert str(error.value) == f"{bad}: parameters differ from {good} (first at '{first}'): different architectures"


def test_average_refuses_ties_that_differ(tmp_path):
    shared = torch.zeros(2)
    tied = write(tmp_path / "tied.pt", {"a": shared, "b": shared})
    untied = write(tmp_path / "untied.pt", {"a": torch.zeros(2), "b": torch.zeros(2)})
    with pytest.raises(CheckpointError, match=rf"^{untied}: parameters differ from {tied} \(first at 'b'\)"):
        average_states([tied, untied])


@pytest.mark.parametrize("content, reason", [
    ({"encoder.embed_tokens.weight": torch.zeros(2)}, "not a fairseq checkpoint (no 'model' entry)"),  # state_dict()
    ([torch.zeros(2)], "not a fairseq checkpoint (a list, not a dict of entries)"),
    ({"model": {"w": torch.zeros(2)}},  # stripped to its weights: fairseq's upgrade indexes its history
     "not a complete fairseq checkpoint (fairseq's loader found no 'best_loss' entry)"),
    ({"model": {}, "optimizer_history": [{"criterion_name": "x", "best_loss": None}]},
     "not a complete fairseq checkpoint (fairseq's loader found no 'extra_state' entry)"),
])
def test_load_state_refuses_what_is_not_a_fairseq_checkpoint_in_one_line(tmp_path, content, reason):
    path = tmp_path / "foreign.pt"
    torch.save(content, path)
    with pytest.raises(CheckpointError) as error:
        load_state(str(path))
    assert str(error.value) == f"{path}: {reason}"


def test_save_state_stores_the_config_as_plain_containers(tmp_path):
    path = str(tmp_path / "saved.pt")
    # fairseq's configs hold enums (--ddp-backend) and interpolations: stored as their values
    cfg = OmegaConf.create({"model": {"arch": "vaswani_transformer", "dropout": 0.1}, "lr": [5e-4],
                            "ddp_backend": DDP_BACKEND_CHOICES("c10d"), "checkpoint": {"lr": "${lr}"}})
    state = {"model": {"w": torch.ones(2)}, "cfg": cfg}
    save_state(state, path)
    assert state["cfg"] is cfg  # the caller's state is not changed
    raw = torch.load(path, weights_only=True)  # plain containers: no omegaconf class or enum in the pickle
    assert raw["cfg"] == {"model": {"arch": "vaswani_transformer", "dropout": 0.1}, "lr": [5e-4],
                          "ddp_backend": "c10d", "checkpoint": {"lr": [5e-4]}}
    assert type(raw["cfg"]) is dict and torch.equal(raw["model"]["w"], torch.ones(2))
    save_state({"model": {}, "cfg": {"plain": 1}}, path)
    assert torch.load(path, weights_only=True)["cfg"] == {"plain": 1}
    assert not [name for name in os.listdir(tmp_path) if name != "saved.pt"]  # no temporary left


@pytest.mark.parametrize("key, dropped", [
    ("encoder.layers.0.in_proj_weight", True),
    ("encoder.layers.11.out_proj_bias", True),
    ("encoder.layers.2.fc1_weight", True),
    ("encoder.layers.2.fc2_bias", True),
    ("model.encoder.layers.0.fc1_weight", True),
    ("encoder.layers.0.fc1.weight", False),  # the real layer
    ("encoder.layers.0.self_attn.in_proj_weight", False),
    ("decoder.layers.0.in_proj_weight", False),
    ("myencoder.layers.0.in_proj_weight", False),
    ("encoder.layers.x.in_proj_weight", False),
    ("encoder.layers.0.in_proj_weight_extra", False),
    ("encoder.layers.0.fc3_weight", False),
])
def test_encoder_fast_path_copies_are_exactly_those_names(key, dropped):
    assert is_encoder_fast_path_copy(key) is dropped


@pytest.mark.parametrize("content, reason", [
    (b"model = transformer\nnot a checkpoint\n", "(pickle instruction 109 is refused by the weights-only loader)"),
    (b"", "(EOFError: EOFError)"),  # torch's error has no text: its type stands for it
    (b"\x80\x02}q\x00.", "(RuntimeError: Invalid magic number; corrupt file?)"),  # a pickle, not torch's format
])
def test_an_unreadable_file_is_refused_with_torchs_reason_in_one_line(tmp_path, content, reason):
    path = tmp_path / "bad.pt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as error:
        load_state(str(path))
    assert str(error.value) == f"{path}: not a readable checkpoint, truncated or not a torch file {reason}"


def test_the_reason_is_the_first_line_after_torchs_preamble():
    from fairseq_plugins.checkpoints import refusal

    error = RuntimeError("Weights only load failed. In PyTorch 2.6 ...\n\nWeightsUnpickler error: Bad state\n"
                         "  in field x\n\nCheck the documentation of torch.load to learn more")
    assert refusal("x.pt", error) == ("x.pt: not a readable checkpoint, truncated or not a torch file "
                                       "(RuntimeError: WeightsUnpickler error: Bad state)")
