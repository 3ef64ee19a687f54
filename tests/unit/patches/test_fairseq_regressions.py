"""What fairseq's own unit tests caught the suite breaking, checked without a fairseq checkout.

``bash scripts/fairseq_own_tests.sh FAIRSEQ_REPO_DIR`` runs fairseq's tests without and with the
suite (docs/RELIABILITY.md); CI has neither the network nor fairseq's tests, so each regression
found there has a focused test here, with the suite loaded (tests/helpers.py imports it):

* ``TestJitSequenceGenerator::test_ensemble_sequence_generator``: ``torch.jit.script`` of fairseq's
  ``SequenceGenerator`` (the suite wraps some of its methods);
* ``TestCheckpointUtils::test_load_ema_from_checkpoint``: a ``torch.load`` replaced after the suite
  (there, a mock) must still be the one fairseq's checkpoint loaders call, and still be
  ``torch.load`` afterwards; and the suite's weights-only loading must not reach another thread.
"""
import argparse
import dataclasses
import io
import threading

import helpers  # noqa: F401  (imports the suite: its patches are installed)
import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.data import Dictionary
from fairseq.models.transformer import TransformerModel
from fairseq.sequence_generator import SequenceGenerator


@pytest.fixture(scope="module")
def tiny_transformer():
    """fairseq's own ``transformer`` (2 encoder layers, 1 decoder layer, d=16) over a 20-word dictionary."""
    torch.manual_seed(0)
    dictionary = Dictionary()
    for i in range(20):
        dictionary.add_symbol(f"w{i}")
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    TransformerModel.add_args(parser)
    args = parser.parse_args([])
    args.encoder_layers, args.decoder_layers = 2, 1
    args.encoder_embed_dim = args.decoder_embed_dim = 16
    args.encoder_ffn_embed_dim = args.decoder_ffn_embed_dim = 32
    args.encoder_attention_heads = args.decoder_attention_heads = 2
    task = argparse.Namespace(source_dictionary=dictionary, target_dictionary=dictionary)
    return TransformerModel.build_model(args, task).eval(), dictionary


def test_sequence_generator_compiles_with_torchscript_and_decodes_as_in_python(tiny_transformer, tmp_path):
    model, dictionary = tiny_transformer
    generator = SequenceGenerator([model], dictionary, beam_size=2, no_repeat_ngram_size=2, max_len_b=10)
    scripted = torch.jit.script(generator)
    scripted.save(str(tmp_path / "generator.pt"))
    loaded = torch.jit.load(str(tmp_path / "generator.pt"))

    src_tokens = torch.tensor([[5, 6, 7, 8, 9, dictionary.eos()], [dictionary.pad(), dictionary.pad(), 10, 11, 12,
                                                                   dictionary.eos()]])  # (2, 6), left-padded
    sample = {"net_input": {"src_tokens": src_tokens, "src_lengths": torch.tensor([6, 4])}}
    with torch.no_grad():
        eager, compiled = generator(sample), loaded(sample)
    assert len(eager) == len(compiled) == 2
    for eager_beam, compiled_beam in zip(eager, compiled):
        assert len(eager_beam) == len(compiled_beam) == 2
        for a, b in zip(eager_beam, compiled_beam):
            assert torch.equal(a["tokens"], b["tokens"])
            torch.testing.assert_close(a["positional_scores"], b["positional_scores"])


@pytest.fixture(scope="module")
def checkpoint(tiny_transformer, tmp_path_factory):
    """A checkpoint of ``tiny_transformer`` as fairseq writes one, with an EMA copy of the weights that
    differs from them in every tensor (so a loader returning the other set is caught); and the two sets."""
    model, _ = tiny_transformer
    path = str(tmp_path_factory.mktemp("checkpoint") / "checkpoint_last.pt")
    weights = {name: value.clone() for name, value in model.state_dict().items()}
    ema = {name: value + 1 for name, value in weights.items()}
    checkpoint_utils.torch_persistent_save({
        "args": None, "cfg": None, "model": weights, "last_optimizer_state": None,
        "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "FairseqAdam",
                               "lr_scheduler_state": {"best": None}, "num_updates": 3}],
        "extra_state": {"train_iterator": {"epoch": 1}, "ema": ema},
    }, path)
    return path, {"load_checkpoint_to_cpu": weights, "load_ema_from_checkpoint": ema}


LOADERS = {
    "load_checkpoint_to_cpu": lambda path: checkpoint_utils.load_checkpoint_to_cpu(path)["model"],
    "load_ema_from_checkpoint": lambda path: checkpoint_utils.load_ema_from_checkpoint(path)["model"],
}


def assert_same_weights(found, expected):
    assert found.keys() == expected.keys()
    for name, value in expected.items():
        assert torch.equal(found[name], value), name


@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_a_torch_load_installed_after_the_suite_is_called_by_fairseq_and_kept(checkpoint, loader, monkeypatch):
    path, expected = checkpoint
    calls = []
    underlying = torch.load

    def recording_load(f, *args, **kwargs):
        calls.append(kwargs.get("weights_only"))
        return underlying(f, *args, **kwargs)

    monkeypatch.setattr(torch, "load", recording_load)
    weights = LOADERS[loader](path)
    assert calls == [True], "fairseq's load must go through the torch.load found, weights-only"
    assert torch.load is recording_load
    assert_same_weights(weights, expected[loader])


@dataclasses.dataclass
class Marker:
    """An object only a full (not weights-only) unpickling returns."""

    value: int


class PausingReader(io.BufferedReader):
    """A checkpoint file whose first read (inside torch.load) waits until ``resume`` is set."""

    def __init__(self, path, inside, resume):
        super().__init__(io.FileIO(path, "rb"))
        self.inside, self.resume = inside, resume

    def read(self, *args):
        if not self.inside.is_set():
            self.inside.set()
            assert self.resume.wait(60)
        return super().read(*args)


def test_another_threads_torch_load_is_unchanged_while_fairseq_loads_a_checkpoint(checkpoint, monkeypatch):
    path, expected = checkpoint
    inside, resume, loaded = threading.Event(), threading.Event(), []
    # fairseq's load_checkpoint_to_cpu opens the file with the built-in open: this module-level name shadows it.
    monkeypatch.setattr(checkpoint_utils, "open", lambda path, mode: PausingReader(path, inside, resume), raising=False)
    buffer = io.BytesIO()
    torch.save(Marker(7), buffer)

    loader = threading.Thread(target=lambda: loaded.append(checkpoint_utils.load_checkpoint_to_cpu(path)))
    loader.start()
    try:
        assert inside.wait(60), "fairseq never read the checkpoint"
        buffer.seek(0)
        other = torch.load(buffer, weights_only=False)  # this thread's own choice, during the other's load
    finally:
        resume.set()
        loader.join(60)
    assert other == Marker(7)
    assert loaded
    assert_same_weights(loaded[0]["model"], expected["load_checkpoint_to_cpu"])
