"""patches/models.py: fairseq's own models, with the behaviour out and in."""
import logging

import pytest
import torch
from omegaconf import open_dict
from patching import OFFICIAL_0_12_2, out, tiny

from fairseq_plugins import patches


def test_encoder_fast_path_is_only_for_fairseq_0_12_2(caplog, tiny):
    """0.12.2: a loaded built-in transformer encodes as one never loaded (fairseq's own path dies); others: out."""
    patch = patches.PATCHES["encoder_fast_path"]
    if not OFFICIAL_0_12_2:  # fairseq-fixed has no fast path to keep off: the patch stays out
        assert not patch.installed
        with caplog.at_level(logging.DEBUG, logger="fairseq_plugins.patches"):
            assert not patch.install()
        assert caplog.records == [] and "not for this fairseq" in patch.unneeded()  # silent: not needed here
        return
    cfg, task, _, sample = tiny
    with open_dict(cfg):
        cfg.model._name = "transformer"
    torch.manual_seed(1)
    never_loaded = task.build_model(cfg.model).eval()  # the ordinary path: the oracle

    def encode():
        model = task.build_model(cfg.model)
        model.load_state_dict(never_loaded.state_dict())  # as fairseq-generate loads a checkpoint
        return model.eval().encoder(source, lengths)["encoder_out"][0]
    source, lengths = sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"]
    with torch.no_grad():
        expected = never_loaded.encoder(source, lengths)["encoder_out"][0]
        with out("encoder_fast_path"), pytest.raises(RuntimeError, match="Mask Type"):
            encode()
        assert patch.installed
        torch.testing.assert_close(encode(), expected, rtol=0, atol=0)
