"""torch.export of every family, and torch.jit.script / the seq2seq LSTM's sort where they cost
nothing. Oracle: the eager model (Python loops, packed LSTM, fairseq's incremental decoding) on
batches and lengths the programs were not traced with; within 1e-5."""
import argparse

import pytest
import torch
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

import fairseq_plugins  # noqa: F401  (registers the models)
from fairseq_plugins.errors import ConfigError
from fairseq_plugins.export.torch_export import expand_beams, export_encoder, export_model, state_kinds, state_names
from fairseq_plugins.modules.beam_cache import BeamCache

DICT = Dictionary()
for _w in range(30):
    DICT.add_symbol(f"w{_w}")


class Task:
    source_dictionary = DICT
    target_dictionary = DICT


def build(arch):
    args = argparse.Namespace(arch=arch)
    ARCH_CONFIG_REGISTRY[arch](args)
    torch.manual_seed(0)
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, Task)
    with torch.no_grad():  # no near-zero initialisation hiding a term
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model.eval()


def batch(lengths, seed):
    """Left-padded sentences ending in EOS."""
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths)), DICT.pad())
    for b, n in enumerate(lengths):
        words = torch.randint(DICT.nspecial, len(DICT), (n - 1,), generator=g)
        src[b, max(lengths) - n:] = torch.cat([words, torch.tensor([DICT.eos()])])
    return src


def close(actual, expected):
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ["rnnsearch_tiny", "rnnencdec_tiny", "seq2seq_lstm_tiny"])
def test_exported_encoder_and_decoder_step_equal_eager_decoding(arch):
    model = build(arch)
    encoder, step = export_model(model)
    names = state_names(model)
    for lengths, seed in (((9, 4, 6, 11), 3), ((1 + 2,), 4), ((12, 12), 5)):  # new batch sizes and lengths
        src = batch(lengths, seed)
        with torch.no_grad():
            encoder_out = model.encoder(src)
            state = encoder.module()(src)
            eager_state = BeamCache.for_encoder_out(encoder_out)
            model.decoder.start_cache(encoder_out, eager_state)
            assert len(state) == len(names) and names[-1] == "slots"
            for tensor, expected in zip(state, eager_state.state()):  # rows [B, 1, ...], slots [B, 1, 0]
                close(tensor, expected)
            incremental_state, prev = {}, torch.full((len(lengths), 1), DICT.eos())
            for _ in range(6):  # greedy decoding, the eager decoder as fairseq's generator drives it
                logits, _ = model.decoder(prev, encoder_out, incremental_state=incremental_state)
                expected = model.get_normalized_probs((logits[:, -1:], None), log_probs=True)[:, 0]
                log_probs, *state = step.module()(prev[:, -1:], *state)
                close(log_probs, expected)
                prev = torch.cat([prev, expected.argmax(-1, keepdim=True)], dim=1)


def _against_eager_beam_decoding(model, src, beam, g, state, reorder, step):
    """Seven steps of ``step(prev_token [N], state) -> (log_probs, state)`` against the eager
    decoder as fairseq's beam search drives it (beams grouped, caches moved by the reorder); before
    each step but the first, ``reorder(state, order, beams)`` moves the state outside: row n
    continues row ``order[n]`` of its beam, and at t = 4 the first of several sentences finished
    (``beams``: the beams that go on). The tokens are random: a beam's hypotheses differ, so reading another's
    state shows."""
    rows = torch.arange(src.size(0)).repeat_interleave(beam)
    encoder_out = model.encoder.reorder_encoder_out(model.encoder(src), rows)
    incremental_state, prev = {}, torch.full((rows.numel(), 1), DICT.eos())
    for t in range(7):
        if t > 0:
            n = prev.size(0)
            order = torch.randint(0, beam, (n,), generator=g) + torch.arange(n) // beam * beam
            beams = torch.arange(n // beam)
            if t == 4 and beams.numel() > 1:
                order, beams = order[beam:], beams[1:]
            model.decoder.reorder_incremental_state(incremental_state, order)
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, order)
            state, prev = reorder(state, order, beams), prev[order]
        logits, _ = model.decoder(prev, encoder_out, incremental_state=incremental_state)
        expected = model.get_normalized_probs((logits[:, -1:], None), log_probs=True)[:, 0]
        log_probs, state = step(prev[:, -1], state)
        close(log_probs, expected)
        prev = torch.cat([prev, torch.randint(DICT.nspecial, len(DICT), (prev.size(0), 1), generator=g)], dim=1)


def test_exported_transformer_decoder_step_equals_eager_beam_decoding():
    """The Transformer's programs (traced at batch 2, target length 2) on other batch sizes and
    every target length from 0, one hypothesis per row (G = 1), the beam search's reorders applied
    to every state tensor's rows outside (``index_select``)."""
    model = build("vaswani_transformer_tiny")
    encoder, step = export_model(model)
    assert state_names(model) == ["layers.0.encoder_attn.k", "layers.0.encoder_attn.v",
                                  "layers.1.encoder_attn.k", "layers.1.encoder_attn.v",
                                  "layers.0.self_attn.k", "layers.0.self_attn.v",
                                  "layers.1.self_attn.k", "layers.1.self_attn.v", "encoder_padding_mask", "slots"]

    def run(prev, state):
        log_probs, *state = step.module()(prev.view(-1, 1), *state)
        keys = state[4]  # layer 0's self-attention keys: [N, h, t + 1, G = 1, d_k]
        assert (keys.size(0), keys.size(3)) == (prev.size(0), 1) and keys.size(2) == state[-1].size(2)
        return log_probs, state

    for lengths, seed, beam in (((9, 4, 6), 3, 2), ((5,), 4, 3)):
        src, g = batch(lengths, seed), torch.Generator().manual_seed(seed)
        with torch.no_grad():
            state = [t.repeat_interleave(beam, dim=0) for t in encoder.module()(src)]
            _against_eager_beam_decoding(model, src, beam, g, state,
                                         lambda state, order, _: [t.index_select(0, order) for t in state], run)


@pytest.mark.parametrize("arch", ["vaswani_transformer_tiny", "rnnsearch_tiny"])
def test_exported_step_in_beams_equals_eager_beam_decoding(arch):
    """``export_model(beams=True)``: the state in beams of a dynamic G, searched outside as the
    module's doc says (the rows and slots follow each hypothesis's parent within its beam, the
    entries and the encoder's state stay, whole beams leave when their sentence finishes);
    batch, beam and lengths other than the traced ones (torch's own checks want R and G above 1;
    the ONNX graphs run any)."""
    model = build(arch)
    encoder, step = export_model(model, beams=True)
    kinds = [*state_kinds(model).values(), "slots"]

    def reorder(state, order, beams):
        beam = state[-1].size(1)
        return [t.flatten(0, 1).index_select(0, order).unflatten(0, (-1, beam)) if kind in ("rows", "slots")
                else t.index_select(0, beams) for t, kind in zip(state, kinds)]

    def run(prev, state):
        log_probs, *state = step.module()(prev.view(-1, state[-1].size(1)), *state)
        return log_probs, state

    for lengths, seed, beam in (((9, 4, 6), 3, 2), ((5, 8, 7), 4, 5)):
        src, g = batch(lengths, seed), torch.Generator().manual_seed(seed)
        with torch.no_grad():
            state = expand_beams(state_kinds(model), encoder.module()(src), beam)
            _against_eager_beam_decoding(model, src, beam, g, state, reorder, run)


def test_exported_transformer_encoder_equals_eager():
    model = build("vaswani_transformer_tiny")
    program = export_encoder(model)
    for lengths, seed in (((9, 4, 6), 3), ((7,), 4), ((5, 5), 5)):  # padded, one sentence, no padding
        src = batch(lengths, seed)
        with torch.no_grad():
            encoder_out, padding_mask = program.module()(src)
            expected = model.encoder(src)
        close(encoder_out, expected["encoder_out"][0])
        assert torch.equal(padding_mask, src.eq(DICT.pad()))


def test_lstm_encoder_generation_scan_equals_nn_lstm_on_each_sentence_alone():
    """Generation's scan over the cells (what torch.export traces), on a padded batch, against
    nn.LSTM run on each sentence's real tokens alone, and against training's packed path."""
    encoder = build("seq2seq_lstm_tiny").encoder
    x = torch.randn(3, 7, 32)
    padding = batch((7, 2, 5), 6).eq(DICT.pad())
    packed = encoder.final_state(x, padding)  # autograd on: nn.LSTM, packed
    with torch.no_grad():
        h_n, c_n = encoder.final_state(x, padding)
        for b in range(3):
            _, (h_alone, c_alone) = encoder.rnn(x[b:b + 1][~padding[b:b + 1]].unsqueeze(0))
            close(h_n[:, b], h_alone[:, 0])
            close(c_n[:, b], c_alone[:, 0])
    close(h_n, packed[0].detach())
    close(c_n, packed[1].detach())


@pytest.mark.parametrize("arch", ["rnnsearch_tiny", "rnnencdec_tiny", "seq2seq_lstm_tiny"])
def test_scripted_rnn_encoders_equal_eager(arch):
    model = build(arch)
    scripted = torch.jit.script(model.encoder)
    src = batch((9, 4, 6), 7)
    with torch.no_grad():
        expected, actual = model.encoder(src), scripted(src)
    assert expected.keys() == actual.keys()
    for key in expected:
        for a, e in zip(actual[key], expected[key]):
            close(a, e)
