"""vaswani_transformer's defaults where the paper is silent, as docs/DEFAULTS.md decides them:
fairseq's command lines build fairseq's sizes, and the FFN starts from fairseq's initialisation."""
import logging
import math
from argparse import Namespace

import pytest
import torch
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

import fairseq_plugins  # noqa: F401  (registers the models)

SIZES = ("layers", "embed_dim", "ffn_embed_dim", "attention_heads")


def filled(name, **given):
    args = Namespace(arch=name, **given)
    ARCH_CONFIG_REGISTRY[name](args)
    return args


@pytest.mark.parametrize("given", [
    dict(encoder_layers=3),
    dict(encoder_layers=3, encoder_embed_dim=256, encoder_ffn_embed_dim=1024, encoder_attention_heads=4),
    dict(encoder_attention_heads=4, decoder_layers=2),
    dict(),
])
def test_decoder_sizes_follow_fairseqs_rule_when_only_the_encoders_are_given(given):
    ours, theirs = filled("vaswani_transformer", **given), filled("transformer", **given)
    for side in ("encoder", "decoder"):
        assert [getattr(ours, f"{side}_{s}") for s in SIZES] == [getattr(theirs, f"{side}_{s}") for s in SIZES]


@pytest.mark.parametrize("ours,theirs", [("vaswani_transformer_big", "transformer_vaswani_wmt_en_de_big")])
def test_big_sizes_equal_fairseqs_big(ours, theirs):
    a, b = filled(ours), filled(theirs)
    assert [getattr(a, f"{side}_{s}") for side in ("encoder", "decoder") for s in SIZES] == \
           [getattr(b, f"{side}_{s}") for side in ("encoder", "decoder") for s in SIZES]


def build(**given):
    d = Dictionary()
    for i in range(20):
        d.add_symbol(f"w{i}")
    task = Namespace(source_dictionary=d, target_dictionary=d)
    args = filled("vaswani_transformer", encoder_embed_dim=64, encoder_ffn_embed_dim=256,
                  encoder_attention_heads=4, **given)
    return ARCH_MODEL_REGISTRY["vaswani_transformer"].build_model(args, task)


def test_a_decoder_that_differs_from_the_encoder_is_named_in_one_line(caplog):
    with caplog.at_level(logging.INFO, logger="fairseq_plugins.models"):
        build(encoder_layers=2)
    lines = [r.getMessage() for r in caplog.records if "decoder" in r.getMessage()]
    assert lines == ["vaswani_transformer: encoder 2 layers, 4 heads; decoder 6 layers, 8 heads "
                     "(--decoder-layers/--decoder-attention-heads do not follow --encoder-*, as in "
                     "fairseq's transformer)"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fairseq_plugins.models"):  # the decoder the smaller
        build(encoder_layers=6, decoder_layers=6, decoder_attention_heads=2)
    lines = [r.getMessage() for r in caplog.records if "decoder" in r.getMessage()]
    assert lines == ["vaswani_transformer: encoder 6 layers, 4 heads; decoder 6 layers, 2 heads "
                     "(--decoder-layers/--decoder-attention-heads do not follow --encoder-*, as in "
                     "fairseq's transformer)"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fairseq_plugins.models"):
        build(encoder_layers=2, decoder_layers=2, decoder_attention_heads=4)
    assert not [r for r in caplog.records if "decoder" in r.getMessage()]


def test_ffn_starts_from_nn_linears_initialisation_by_default_and_xavier_on_request():
    torch.manual_seed(0)
    fc1 = build(encoder_layers=1, decoder_layers=1).encoder.layers[0].fc1.requires_grad_(False)  # W_1: 64 -> 256
    bound = 1 / math.sqrt(64)  # nn.Linear: U(±1/√fan_in), biases too
    assert fc1.bias.abs().min() > 0 and fc1.bias.abs().max() <= bound
    assert fc1.weight.abs().max() <= bound and fc1.weight.std() == pytest.approx(bound / math.sqrt(3), rel=0.05)
    fc1 = build(encoder_layers=1, decoder_layers=1, ffn_init="xavier").encoder.layers[0].fc1.requires_grad_(False)
    xavier = math.sqrt(6 / (64 + 256))  # U(±√(6 / (fan_in + fan_out))), zero biases
    assert fc1.bias.abs().max() == 0
    assert fc1.weight.abs().max() <= xavier and fc1.weight.std() == pytest.approx(xavier / math.sqrt(3), rel=0.05)


@pytest.mark.parametrize("ours,theirs", [("vaswani_transformer", "transformer"),
                                         ("vaswani_transformer_base", "transformer"),
                                         ("vaswani_transformer_big", "transformer_vaswani_wmt_en_de_big")])
def test_every_option_fairseqs_architecture_fills_in_is_filled_in_as_fairseq_does(ours, theirs):
    a, b = vars(filled(ours)), vars(filled(theirs))
    shared = sorted(k for k in a if k in b and k != "arch")
    assert len(shared) >= 19  # sizes, dropouts, pre-LN, learned positions, ties, activation checkpointing
    assert {k: a[k] for k in shared} == {k: b[k] for k in shared}


@pytest.mark.parametrize("name,n,d_model,d_ff,h,p_drop", [
    ("vaswani_transformer", 6, 512, 2048, 8, 0.1),  # Table 3, base
    ("vaswani_transformer_big", 6, 1024, 4096, 16, 0.3),  # Table 3, big
    ("vaswani_transformer_tiny", 2, 64, 256, 4, 0.1),  # its docstring: CPU tests and the quickstart
])
def test_the_architectures_sizes_are_table_3s(name, n, d_model, d_ff, h, p_drop):
    args = filled(name)
    for side in ("encoder", "decoder"):
        assert [getattr(args, f"{side}_{s}") for s in SIZES] == [n, d_model, d_ff, h]
    assert args.dropout == p_drop


def test_the_suites_own_options_default_to_the_paper_and_to_fairseqs_limits():
    from fairseq.models.transformer import DEFAULT_MAX_SOURCE_POSITIONS, DEFAULT_MAX_TARGET_POSITIONS
    args = filled("vaswani_transformer")
    assert (args.max_source_positions, args.max_target_positions) == (DEFAULT_MAX_SOURCE_POSITIONS,
                                                                      DEFAULT_MAX_TARGET_POSITIONS)
    assert args.fairseq_positions is False  # the paper's sinusoids
    assert args.ffn_init == "linear" and args.alignment_layer == -1  # fairseq's FFN start, the top layer
    assert filled("vaswani_transformer", max_source_positions=64).max_source_positions == 64
