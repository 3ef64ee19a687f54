"""RNNsearch, RNNencdec and seq2seq_lstm: the papers' equations recomputed step by step,
initialisation, padding invariance, incremental decoding, alignments, source reversal,
build errors and the halving LR schedule."""
import argparse
import math
import warnings

import pytest
import torch
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

import fairseq_plugins  # noqa: F401  (registers the models)
from fairseq_plugins.errors import ConfigError
from fairseq_plugins.models.seq2seq_lstm import reverse_source_tokens
from fairseq_plugins.modules.additive_attention import AdditiveAttention
from fairseq_plugins.modules.beam_cache import BeamCache, get_cache
from fairseq_plugins.modules.maxout import Maxout
from paper_references import ref_attention, ref_decoder, ref_encoder_gru

DICT = Dictionary()
for _w in range(20):
    DICT.add_symbol(f"w{_w}")
PAD, EOS = DICT.pad(), DICT.eos()
TINY = {"encoder_embed_dim": 5, "encoder_hidden_size": 6, "decoder_embed_dim": 4,
        "decoder_hidden_size": 7, "attention_hidden_size": 8, "maxout_dim": 3}


class Task:
    source_dictionary = DICT
    target_dictionary = DICT


def build(arch, randomize=True, std=0.5, **overrides):
    """A model on the 24-symbol dictionary; ``randomize`` draws every parameter from N(0, std²)
    so that no term of an equation is hidden by near-zero init."""
    args = argparse.Namespace(arch=arch, **overrides)
    ARCH_CONFIG_REGISTRY[arch](args)
    torch.manual_seed(0)
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, Task)
    if randomize:
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, std)
    return model.eval()


def sentences(lengths, seed=1):
    """Left-padded batch of random sentences ending in EOS, as fairseq feeds sources."""
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    src = torch.full((len(lengths), T), PAD)
    for b, n in enumerate(lengths):
        src[b, T - n:] = torch.cat([torch.randint(4, len(DICT), (n - 1,), generator=g), torch.tensor([EOS])])
    return src


def targets(bsz, length, seed=2):
    g = torch.Generator().manual_seed(seed)
    return torch.cat([torch.full((bsz, 1), EOS), torch.randint(4, len(DICT), (bsz, length - 1), generator=g)], 1)


# ---------------------------------------------------------------- equations


def test_bigru_encoder_and_initial_state_follow_the_paper():
    model = build("rnnsearch_tiny", **TINY)
    src = sentences([4, 6, 2])
    out = model.encoder(src)
    layer = model.encoder.layers[0]
    for b in range(src.size(0)):
        real = src[b].ne(PAD)
        x = model.encoder.embed_tokens.weight[src[b][real]]  # Ē x_j
        h_ref = torch.cat([ref_encoder_gru(layer, x, 0), ref_encoder_gru(layer, x, 1)], dim=1)  # [→h_j; ←h_j]
        torch.testing.assert_close(out["encoder_out"][0][b][real], h_ref, atol=1e-6, rtol=1e-5)
        back_first = h_ref[0, layer.hidden_size:]  # ←h_1
        torch.testing.assert_close(out["backward_first"][0][b], back_first, atol=1e-6, rtol=1e-5)
        s0 = initial_state(model, out)[b]
        W_s = model.decoder.W_s
        torch.testing.assert_close(s0, torch.tanh(W_s.weight @ back_first + W_s.bias), atol=1e-6, rtol=1e-5)
    at_padding = out["encoder_out"][0][src.eq(PAD)]  # (padded positions of the batch, 2n)
    assert at_padding.size(0) > 0 and at_padding.abs().max() == 0  # annotations at padding are zero


@pytest.mark.parametrize("arch", ["rnnsearch_tiny", "rnnencdec_tiny"])
def test_a_stacked_encoder_feeds_each_layer_the_one_below_with_dropout_between(arch):
    """--encoder-layers 3: each GRU reads the outputs of the one below it; in training, dropout
    applies once to the embeddings and once between layers."""
    p = 0.25
    model = build(arch, encoder_layers=3, dropout=p, **TINY)
    encoder, src = model.encoder, sentences([4, 6, 2])
    padding = src.eq(PAD)
    assert len(encoder.layers) == 3
    h = encoder.embed_tokens(src)
    for layer in encoder.layers:
        h, h_n = layer(h, padding)
    out = encoder(src)
    if arch == "rnnsearch_tiny":
        torch.testing.assert_close(out["encoder_out"][0], h)
        torch.testing.assert_close(out["backward_first"][0], h_n[1])  # ←h_1 of the top layer
    else:
        torch.testing.assert_close(out["encoder_out"][0], torch.tanh(encoder.V(h_n[0])))  # c from the top layer

    inputs, outputs = [], []

    def record(module, args, output):
        inputs.append(args[0])
        outputs.append(output[0])

    for layer in encoder.layers:
        layer.register_forward_hook(record)
    encoder.train()
    torch.manual_seed(0)
    encoder(src)
    below = [encoder.embed_tokens(src)] + outputs[:-1]
    for k, (x, y) in enumerate(zip(inputs, below)):
        kept = x != 0
        assert 0 < kept.sum() < (y != 0).sum(), k  # some dropped
        torch.testing.assert_close(x[kept], y[kept] / (1 - p), msg=f"layer {k}")  # the others scaled once


def test_the_papers_gru_reads_one_direction_unless_asked_for_two():
    from fairseq_plugins.modules.gru import GRU
    x, padding = torch.randn(2, 3, 4), torch.zeros(2, 3, dtype=torch.bool)
    for gru, directions in ((GRU(4, 5), 1), (GRU(4, 5, bidirectional=True), 2)):  # nn.GRU's default
        out, final = gru(x, padding)
        assert out.shape == (2, 3, directions * 5) and final.shape == (directions, 2, 5)


def test_additive_attention_follows_the_paper_and_ignores_padding():
    torch.manual_seed(3)
    att = AdditiveAttention(query_size=4, annotation_size=6, hidden_size=5)
    with torch.no_grad():
        for p in att.parameters():
            p.normal_(0, 0.7)
    h = torch.randn(2, 5, 6)
    mask = torch.tensor([[True, True, False, False, False], [False] * 5])
    s_prev = torch.randn(2, 4)
    c, alpha = att(s_prev, att.project_annotations(h), h, mask)
    for b in range(2):
        c_ref, alpha_ref = ref_attention(att, s_prev[b], h[b][~mask[b]])
        torch.testing.assert_close(c[b], c_ref, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(alpha[b][~mask[b]], alpha_ref, atol=1e-6, rtol=1e-5)
    assert alpha[mask].abs().max() == 0
    torch.testing.assert_close(alpha.sum(1), torch.ones(2))
    # the paper's W_a, U_a and v_a, and the MLP's one bias, kept in U_a (U_a h_j is precomputed)
    assert sorted(name for name, _ in att.named_parameters()) == ["U_a.bias", "U_a.weight", "W_a.weight", "v_a.weight"]


@pytest.mark.parametrize("deep_output_state", ["current", "previous"])
def test_rnnsearch_decoder_follows_the_paper(deep_output_state):
    model = build("rnnsearch_tiny", deep_output_state=deep_output_state, **TINY)
    src, prev = sentences([3, 5]), targets(2, 4)
    logits, extra = model(src, None, prev)
    enc = model.encoder(src)
    s0 = initial_state(model, enc)
    att = model.decoder.context.attention
    for b in range(2):
        real = src[b].ne(PAD)
        h = enc["encoder_out"][0][b][real]
        ref_logits, ref_alpha = ref_decoder(model.decoder, s0[b], lambda s: ref_attention(att, s, h), prev[b],
                                            deep_output_state == "previous")
        torch.testing.assert_close(logits[b], ref_logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(extra["attn"][0][b][:, real], torch.stack(ref_alpha), atol=1e-6, rtol=1e-5)


def test_the_two_deep_output_options_differ():
    src, prev = sentences([3, 5]), targets(2, 4)
    current = build("rnnsearch_tiny", deep_output_state="current", **TINY)(src, None, prev)[0]
    previous = build("rnnsearch_tiny", deep_output_state="previous", **TINY)(src, None, prev)[0]
    assert (current - previous).abs().max() > 1e-3


def test_rnnencdec_follows_cho_et_al():
    model = build("rnnencdec_tiny", **TINY)
    src, prev = sentences([3, 5]), targets(2, 4)
    logits, extra = model(src, None, prev)
    assert extra["attn"][0] is None
    enc, V, W_s = model.encoder, model.encoder.V, model.decoder.W_s
    for b in range(2):
        real = src[b].ne(PAD)
        h_T = ref_encoder_gru(enc.layers[0], enc.embed_tokens.weight[src[b][real]], 0)[-1]
        c = torch.tanh(V.weight @ h_T + V.bias)  # c = tanh(V h_T)
        s0 = torch.tanh(W_s.weight @ c + W_s.bias)  # h'_0 = tanh(V' c)
        ref_logits, _ = ref_decoder(model.decoder, s0, lambda s: (c, None), prev[b], False)
        torch.testing.assert_close(logits[b], ref_logits, atol=1e-5, rtol=1e-5)


def ref_lstm_stack(rnn, x, initial):
    """``rnn``'s layers as one single-layer ``torch.nn.LSTM`` each, with its weights, over one sentence
    x (T, C); layer k starts from ``initial[k]`` ((h, c), each (H,)) or zeros. Returns the top
    layer's outputs (T, H) and the final (h, c) of every layer."""
    finals = []
    for k in range(rnn.num_layers):
        layer = torch.nn.LSTM(x.size(-1), rnn.hidden_size)
        with torch.no_grad():
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                getattr(layer, f"{name}_l0").copy_(getattr(rnn, f"{name}_l{k}"))
        state = None if initial[k] is None else (initial[k][0][None], initial[k][1][None])  # (1, H) each
        x, (h, c) = layer(x, state)  # unbatched: x (T, H)
        finals.append((h[0], c[0]))
    return x, finals


def right_padded(src):
    out = torch.full_like(src, PAD)
    for b, row in enumerate(src):
        real = row[row.ne(PAD)]
        out[b, :len(real)] = real
    return out


def test_seq2seq_lstm_follows_sutskever_et_al():
    """Sutskever et al. §3.1-3.3 with every state passed by hand: the encoder reads each sentence's
    words reversed, then its EOS (padding dropped, either side); the decoder's layer k starts from
    the encoder's final (h, c) of layer k; a plain softmax layer on the top decoder layer."""
    model = build("seq2seq_lstm_tiny", std=0.3, encoder_layers=3, encoder_embed_dim=5, decoder_embed_dim=4)
    enc, dec = model.encoder, model.decoder
    layers = enc.rnn.num_layers
    assert layers == dec.rnn.num_layers == 3
    left, prev = sentences([6, 2, 4]), targets(3, 5)

    def reference(src_words, reverse=True, from_encoder=True):
        words = src_words[:-1].flip(0) if reverse else src_words[:-1]
        _, finals = ref_lstm_stack(enc.rnn, enc.embed_tokens.weight[torch.cat([words, src_words[-1:]])],
                                   [None] * layers)
        top, _ = ref_lstm_stack(dec.rnn, dec.embed_tokens.weight[prev[b]], finals if from_encoder else [None] * layers)
        return top @ dec.fc_out.weight.t() + dec.fc_out.bias  # (tgt_len, V)

    for src in (left, right_padded(left)):
        with torch.no_grad():
            logits, _ = model(src, None, prev)
            for b in range(3):
                real = src[b][src[b].ne(PAD)]
                assert real[-1] == EOS
                torch.testing.assert_close(logits[b], reference(real), atol=1e-5, rtol=1e-5)
                # the reference tells the alternatives apart: a decoder that ignored the encoder, and
                # (for more than one word) an encoder that read the natural order
                assert (logits[b] - reference(real, from_encoder=False)).abs().max() > 1e-2
                if len(real) > 2:
                    assert (logits[b] - reference(real, reverse=False)).abs().max() > 1e-2


def test_seq2seq_lstm_drops_out_between_its_layers_in_training_only():
    """--dropout also applies between stacked LSTM layers (nn.LSTM's own dropout), in training
    and with --retain-dropout, not in evaluation; a one-layer LSTM, which has nothing between
    layers, is built without it (nn.LSTM warns otherwise). Only the layers' dropout is left on
    here: two training passes differ, two evaluation passes do not."""
    model = build("seq2seq_lstm_tiny", dropout=0.3)
    enc, dec = model.encoder, model.decoder
    assert enc.rnn.num_layers == dec.rnn.num_layers == 2
    enc.dropout_module.p = dec.dropout_module.p = 0.0  # the embeddings' and outputs' dropout off
    src, prev = sentences([4, 6, 2]), targets(3, 5)

    def passes():
        outputs = []
        for seed in (0, 1):
            torch.manual_seed(seed)
            encoder_out = enc(src)
            if seed == 0:
                first = encoder_out  # both passes' decoders read it
            outputs.append((encoder_out["encoder_h"][0], dec(prev, first)[0]))
        return outputs

    for mode, differ in (("train", True), ("eval", False), ("retain", True)):
        model.train(mode == "train")
        enc.dropout_module.apply_during_inference = dec.dropout_module.apply_during_inference = mode == "retain"
        with torch.set_grad_enabled(mode == "train"):  # --retain-dropout generates without autograd
            (h_a, logits_a), (h_b, logits_b) = passes()
        assert (not torch.equal(h_a, h_b)) == differ, mode  # the encoder's final states
        assert (not torch.equal(logits_a, logits_b)) == differ, mode
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        one = build("seq2seq_lstm_tiny", dropout=0.3, encoder_layers=1)
    assert one.encoder.rnn.dropout == one.decoder.rnn.dropout == 0.0


def test_seq2seq_lstm_encoder_reads_only_words_in_training_as_in_generation():
    """The encoder's two paths to its final state: training's packed nn.LSTM (real words moved to
    the front) and generation's scan (state kept over padding) give the same state, left- or
    right-padded, here with sentences longer than the embedding is wide (3 < 9)."""
    model = build("seq2seq_lstm_tiny", std=0.3, encoder_embed_dim=3)
    for src in (sentences([9, 2, 5]), right_padded(sentences([9, 2, 5]))):
        packed = model.encoder(src)  # autograd on: training's path
        with torch.no_grad():
            scanned = model.encoder(src)
        for key in ("encoder_h", "encoder_c"):
            torch.testing.assert_close(packed[key][0], scanned[key][0], atol=1e-6, rtol=1e-5)


def test_rnnencdec_shares_the_rnnsearch_decoder_code():
    search, encdec = build("rnnsearch_tiny"), build("rnnencdec_tiny")
    assert type(search.decoder) is type(encdec.decoder)
    for name in ("cell", "maxout", "U_o", "V_o", "C_o", "W_o", "W_s"):
        assert type(getattr(search.decoder, name)) is type(getattr(encdec.decoder, name))
    assert type(search.decoder.context) is not type(encdec.decoder.context)
    assert type(search.encoder.layers[0]) is type(encdec.encoder.layers[0])


def test_maxout_takes_the_max_of_consecutive_pairs():
    t_tilde = torch.tensor([[1.0, 5.0, -2.0, -3.0, 0.5, 0.25]])
    assert Maxout(6, 2)(t_tilde).tolist() == [[5.0, -2.0, 0.5]]
    pools_of_3 = torch.tensor([[1.0, 5.0, 7.0, -3.0, 0.25, 0.5]])  # every member counts, the last too
    assert Maxout(6, 3)(pools_of_3).tolist() == [[7.0, 0.5]]
    assert Maxout(6, 1)(t_tilde).tolist() == t_tilde.tolist()
    assert Maxout(6)(t_tilde).tolist() == [[5.0, -2.0, 0.5]]  # the paper's pairs by default
    assert Maxout(1, 1)(torch.tensor([[-4.0]])).tolist() == [[-4.0]]  # the smallest valid sizes


# ---------------------------------------------------------------- initialisation


def assert_normal(p, std, name):
    """``p``'s values look drawn from N(0, std²): their spread and their centre (thousands of
    values: the mean's standard error is under std / 50)."""
    assert abs(p.std().item() - std) < 0.2 * std, name
    assert abs(p.mean().item()) < 0.1 * std, name


def test_paper_initialisation_statistics():
    sizes = dict(encoder_embed_dim=40, encoder_hidden_size=50, decoder_embed_dim=40, decoder_hidden_size=60,
                 attention_hidden_size=70, maxout_dim=30)
    model = build("rnnsearch_tiny", randomize=False, init="paper", **sizes)
    params = dict(model.named_parameters())
    recurrent = [k for k in params if k.endswith((".U_zr.weight", ".U.weight"))]
    assert len(recurrent) == 4  # encoder and decoder U_zr, U
    for name in recurrent:
        for block in params[name].view(-1, params[name].size(-1), params[name].size(-1)):
            torch.testing.assert_close(block @ block.t(), torch.eye(block.size(0)), atol=1e-5, rtol=0)
    for name in ("decoder.context.attention.W_a.weight", "decoder.context.attention.U_a.weight"):
        assert_normal(params[name], 0.001, name)
    assert params["decoder.context.attention.v_a.weight"].abs().max() == 0
    for name, p in params.items():
        if name.endswith(".bias"):
            assert p.abs().max() == 0, name
    others = [k for k in params if not k.endswith(".bias") and k not in recurrent and ".attention." not in k]
    assert len(others) >= 9
    for name in others:
        assert_normal(params[name], 0.01, name)
    for emb in (model.encoder.embed_tokens, model.decoder.embed_tokens):
        assert emb.weight[PAD].abs().max() == 0
    pytorch = build("rnnsearch_tiny", randomize=False, init="pytorch", **sizes)
    assert pytorch.decoder.cell.W.bias.abs().max() > 0  # PyTorch defaults are not the paper's


GRU_PAPER = dict(encoder_embed_dim=620, decoder_embed_dim=620, encoder_hidden_size=1000, decoder_hidden_size=1000,
                 maxout_dim=500, encoder_layers=1, decoder_layers=1, dropout=0.0, deep_output_state="current")
GRU_TINY = dict(GRU_PAPER, encoder_embed_dim=32, decoder_embed_dim=32, encoder_hidden_size=64, decoder_hidden_size=64,
                maxout_dim=32)
LIMITS = dict(max_source_positions=1024, max_target_positions=1024)


@pytest.mark.parametrize("arch,expected", [
    # Bahdanau et al. appendices A and B: m = 620, n = 1000, l = 500, n' = 1000, no dropout, one layer each;
    # PyTorch's initialisation (issue 18, docs/DEFAULTS.md)
    ("rnnsearch", dict(GRU_PAPER, attention_hidden_size=1000, init="pytorch", **LIMITS)),
    ("rnnencdec", dict(GRU_PAPER, init="pytorch", **LIMITS)),
    # the tiny sizes of the quickstart and the CPU tests (their docstring)
    ("rnnsearch_tiny", dict(GRU_TINY, attention_hidden_size=64, init="pytorch", **LIMITS)),
    ("rnnencdec_tiny", dict(GRU_TINY, init="pytorch", **LIMITS)),
    # Sutskever et al. section 3.4: 4 layers of 1000 cells, 1000-dim embeddings, U(-0.08, 0.08), the source reversed
    ("seq2seq_lstm", dict(encoder_embed_dim=1000, decoder_embed_dim=1000, encoder_hidden_size=1000,
                          decoder_hidden_size=1000, encoder_layers=4, decoder_layers=4, dropout=0.0,
                          reverse_source=True, init="paper", **LIMITS)),
    ("seq2seq_lstm_tiny", dict(encoder_embed_dim=32, decoder_embed_dim=32, encoder_hidden_size=64,
                               decoder_hidden_size=64, encoder_layers=2, decoder_layers=2, dropout=0.0,
                               reverse_source=True, init="paper", **LIMITS)),
])
def test_the_architectures_defaults_are_the_papers(arch, expected):
    args = argparse.Namespace(arch=arch)
    ARCH_CONFIG_REGISTRY[arch](args)
    assert {k: getattr(args, k) for k in expected} == expected
    given = argparse.Namespace(arch=arch, encoder_hidden_size=8, maxout_dim=6, dropout=0.2)
    ARCH_CONFIG_REGISTRY[arch](given)  # what the command line gave stays
    assert (given.encoder_hidden_size, given.maxout_dim, given.dropout) == (8, 6, 0.2)
    if arch.startswith("seq2seq"):  # the decoder's LSTM must match the encoder's: it follows it
        assert given.decoder_hidden_size == 8


@pytest.mark.parametrize("arch", ["rnnsearch", "rnnsearch_tiny", "rnnencdec", "rnnencdec_tiny"])
def test_gru_models_default_to_pytorch_initialisation(arch):
    """Issue 18: the paper's N(0, 0.01²) barely learns in short Adam runs, so it is opt-in."""
    W_o = build(arch, randomize=False).decoder.W_o
    # PyTorch's nn.Linear: weight and bias from U(-1/√fan_in, 1/√fan_in); the paper's: N(0, 0.01²) and 0
    bound = 1 / math.sqrt(W_o.in_features)
    assert 0 < W_o.bias.abs().max() <= bound
    assert abs(W_o.weight.std().item() - bound / math.sqrt(3)) < 0.1 * bound


def test_the_recurrent_matrices_default_to_nn_linears_initialisation_in_each_direction():
    """The GRUs' U_zr and U, one (out, in) block per direction (the encoder's stacked for one bmm),
    drawn as nn.Linear draws a weight: U(-1/√in, 1/√in)."""
    torch.manual_seed(0)
    params = dict(build("rnnsearch", randomize=False).named_parameters())  # n = 1000: sharp statistics
    recurrent = [k for k in params if k.endswith((".U_zr.weight", ".U.weight"))]
    assert len(recurrent) == 4  # encoder and decoder U_zr, U
    for name in recurrent:
        for block in params[name].view(-1, *params[name].shape[-2:]):  # each direction's
            bound = 1 / math.sqrt(block.size(1))
            assert 0.99 * bound < block.abs().max() <= bound, name
            assert abs(block.std().item() - bound / math.sqrt(3)) < 0.01 * bound, name


def test_seq2seq_lstm_init_pytorch_keeps_pytorchs_initialisation():
    """--init pytorch: nn.LSTM's and nn.Linear's U(-1/√H, 1/√H) and N(0, 1) embeddings, not the paper's U(-0.08, 0.08)."""
    model = build("seq2seq_lstm_tiny", randomize=False, init="pytorch")
    bound = 1 / math.sqrt(model.encoder.rnn.hidden_size)  # 1/8 for 64 cells
    assert 0.08 < model.encoder.rnn.weight_hh_l0.abs().max() <= bound
    assert abs(model.encoder.embed_tokens.weight.std().item() - 1.0) < 0.1


def test_seq2seq_paper_initialisation_is_uniform_008():
    model = build("seq2seq_lstm_tiny", randomize=False, encoder_hidden_size=100, decoder_hidden_size=100)
    flat = torch.cat([p.flatten() for p in model.parameters()])
    assert flat.abs().max() <= 0.08
    assert abs(flat.std().item() - 0.08 / math.sqrt(3)) < 0.002  # std of U(-a, a) is a/√3


# ---------------------------------------------------------------- padding, incremental, alignment

ARCHS = ["rnnsearch_tiny", "rnnencdec_tiny", "seq2seq_lstm_tiny"]


def log_probs(model, src, prev):
    return model.get_normalized_probs(model(src, None, prev), log_probs=True)


def initial_state(model, encoder_out):
    """The decoder's s_0 as its decoding cache starts."""
    cache = BeamCache.for_encoder_out(encoder_out)
    model.decoder.start_cache(encoder_out, cache)
    return cache.per_hypothesis["s"]


@pytest.mark.parametrize("arch", ARCHS)
def test_teacher_forcing_makes_no_decoding_cache(arch, monkeypatch):
    """A full forward (training, scoring) reads the encoder output as it is; only step-by-step
    decoding makes a BeamCache, once, at its first step."""
    made, make = [], BeamCache.for_encoder_out.__func__
    monkeypatch.setattr(BeamCache, "for_encoder_out", classmethod(lambda cls, out: made.append(1) or make(cls, out)))
    model = build(arch)
    src, prev = sentences([6, 3]), targets(2, 4)
    log_probs(model, src, prev)
    assert made == []
    model.decoder(prev[:, :1], model.encoder(src), incremental_state={})
    assert made == [1]


@pytest.mark.parametrize("arch", ARCHS)
def test_padding_does_not_change_a_sentence(arch):
    # float64: a different batch size changes float32 matmul blocking (1e-4 on log-probs near 5),
    # while a padding leak would not shrink with the precision
    model = build(arch).double()
    batch = sentences([9, 4, 7])
    alone = batch[1:2, batch[1].ne(PAD)]  # the 4-token sentence without padding
    prev = targets(3, 5)
    enc_batch, enc_alone = model.encoder(batch), model.encoder(alone)
    for key, values in enc_alone.items():
        if values[0].dtype == torch.bool:
            continue
        got = enc_batch[key][0][1:2]
        if got.dim() == 3 and key == "encoder_out":  # annotations: compare real positions
            got = got[:, batch[1].ne(PAD)]
        torch.testing.assert_close(got, values[0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(log_probs(model, batch, prev)[1:2], log_probs(model, alone, prev[1:2]),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_incremental_decoding_with_beam_reordering_equals_teacher_forcing(arch):
    model = build(arch, std=0.2)  # log-probs of order 1, where 1e-5 is meaningful in fp32
    src = sentences([6, 3])
    beam = 3
    idx = torch.arange(2).repeat_interleave(beam)  # row -> source sentence
    enc = model.encoder.reorder_encoder_out(model.encoder(src), idx)
    g = torch.Generator().manual_seed(5)
    tokens = torch.full((2 * beam, 1), EOS)
    incremental_state, steps = {}, []
    for step in range(5):
        out = model.decoder(tokens, encoder_out=enc, incremental_state=incremental_state)
        steps.append(model.get_normalized_probs(out, log_probs=True)[:, -1])
        if arch == "rnnsearch_tiny":
            assert out[1]["attn"][0].shape == (2 * beam, 1, src.size(1))
        # beam search: rows swap places within their sentence, then each extends by a token
        order = torch.cat([b * beam + torch.randperm(beam, generator=g) for b in range(2)])
        model.decoder.reorder_incremental_state_scripting(incremental_state, order)
        enc = model.encoder.reorder_encoder_out(enc, order)
        idx, tokens = idx[order], tokens[order]
        steps = [s[order] for s in steps]
        tokens = torch.cat([tokens, torch.randint(4, len(DICT), (2 * beam, 1), generator=g)], dim=1)
    full = log_probs(model, src[idx], tokens[:, :-1])
    torch.testing.assert_close(torch.stack(steps, dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ["rnnsearch_tiny", "rnnencdec_tiny"])
def test_decoding_keeps_sentence_tensors_unmoved_through_beam_reorders_then_any_order(arch):
    """As SequenceGenerator decodes (rows repeated per beam before the first step, reorders within
    beams, a finished sentence dropped), then rows crossing beams: every step equals teacher
    forcing of the same rows, and the per-sentence tensors are not copied while every beam stays."""
    model = build(arch, std=0.2)
    src = sentences([6, 3, 5])
    idx = torch.arange(3).repeat_interleave(2)
    enc = model.encoder.reorder_encoder_out(model.encoder(src), idx)
    orders = [torch.tensor([1, 1, 2, 3, 5, 4]), torch.tensor([0, 1, 3, 3, 4, 5]),
              torch.tensor([0, 1, 4, 5]), torch.tensor([1, 1, 3, 2]),  # sentence 1 finished
              torch.tensor([2, 0, 3, 1]), torch.tensor([0, 0, 1, 3])]  # rows cross beams
    g = torch.Generator().manual_seed(5)
    tokens, state, steps, kept = torch.full((6, 1), EOS), {}, [], None
    with torch.no_grad():
        for k, order in enumerate([None] + orders):
            if order is not None:
                model.decoder.reorder_incremental_state_scripting(state, order)
                enc = model.encoder.reorder_encoder_out(enc, order)
                idx, tokens, steps = idx[order], tokens[order], [s[order] for s in steps]
                tokens = torch.cat([tokens, torch.randint(4, len(DICT), (len(order), 1), generator=g)], dim=1)
            out = model.decoder(tokens, encoder_out=enc, incremental_state=state)
            steps.append(model.get_normalized_probs(out, log_probs=True)[:, -1])
            cache = get_cache(model.decoder, state)
            per_sentence = [t.data_ptr() for t in cache.per_beam.values()]
            if k <= 2:  # every beam stays: nothing shared moves
                assert per_sentence and cache.beam_size == 2 and per_sentence == (kept or per_sentence)
            kept = per_sentence
    full = log_probs(model, src[idx], tokens)
    torch.testing.assert_close(torch.stack(steps, dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bsz, queries, src_len", [(3, 2, 4), (3, 1, 4), (3, 2, 1), (1, 2, 4)])  # G: training's 1 too
def test_alignment_energies_gradients_recomputed_equal_autograd_of_the_formula(bsz, queries, src_len):
    """e = v_aᵀ tanh(W_a s + U_a h) with the tanh recomputed in backward: values and gradients
    equal autograd through the formula (float64), grouped queries included; and the forward
    keeps no (bsz, src_len, n') activation per step for the backward pass."""
    from fairseq_plugins.modules.additive_attention import _AlignmentEnergies
    g = torch.Generator().manual_seed(0)
    W_a_s = torch.randn(bsz, queries, 5, dtype=torch.float64, generator=g, requires_grad=True)
    U_a_h = torch.randn(bsz, src_len, 5, dtype=torch.float64, generator=g, requires_grad=True)
    v_a = torch.randn(5, dtype=torch.float64, generator=g, requires_grad=True)
    grad_e = torch.randn(bsz, queries, src_len, dtype=torch.float64, generator=g)
    e = _AlignmentEnergies.apply(W_a_s, U_a_h, v_a)
    grads = torch.autograd.grad(e, (W_a_s, U_a_h, v_a), grad_e)
    e_ref = torch.tanh(W_a_s.unsqueeze(2) + U_a_h.unsqueeze(1)) @ v_a  # the paper's formula
    grads_ref = torch.autograd.grad(e_ref, (W_a_s, U_a_h, v_a), grad_e)
    torch.testing.assert_close(e, e_ref)
    for got, ref in zip(grads, grads_ref):
        torch.testing.assert_close(got, ref)

    model = build("rnnsearch_tiny", attention_hidden_size=40).train()  # n' = 40: no other size is 40
    src, prev = sentences([7, 3, 5]), targets(3, 6)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        model(src, None, prev)
    n_prime = model.decoder.context.attention.W_a.out_features
    # tensors of (bsz, src_len, n') floats or more: U_a h (one, shared by the steps), no tanh(·) per step
    large = {t.data_ptr() for t in saved if t.dim() >= 3 and t.size(-1) == n_prime and t.numel() >= 3 * 7 * n_prime}
    assert len(large) == 1


@pytest.mark.parametrize("arch", ARCHS)
def test_alignments_are_asked_only_of_a_model_with_attention(arch):
    """fairseq-generate --print-alignment: RNNsearch aligns each target word with the source;
    RNNencdec and the seq2seq LSTM have no attention and are refused in one line (fairseq's own
    extraction fails with an IndexError)."""
    from fairseq.sequence_generator import SequenceGeneratorWithAlignment
    model = build(arch)
    src = sentences([4, 6])
    sample = {"net_input": {"src_tokens": src, "src_lengths": src.ne(PAD).sum(1)}}
    generator = SequenceGeneratorWithAlignment([model], DICT, print_alignment="hard", beam_size=2, max_len_b=4)
    if arch == "rnnsearch_tiny":
        hypos = generator.generate([model], sample)
        assert all(len(h[0]["alignment"]) > 0 for h in hypos)
    else:
        with pytest.raises(ConfigError, match=f"^--print-alignment: {type(model).__name__} has no attention"):
            generator.generate([model], sample)


def test_alignments_have_target_by_source_shape_sum_to_one_and_skip_padding():
    model = build("rnnsearch_tiny")
    src, prev = sentences([7, 3, 5]), targets(3, 4)
    attn = model(src, None, prev)[1]["attn"][0]
    assert attn.shape == (3, 4, 7)
    torch.testing.assert_close(attn.sum(dim=2), torch.ones(3, 4))
    assert attn.masked_select(src.eq(PAD).unsqueeze(1).expand_as(attn)).abs().max() == 0


# ---------------------------------------------------------------- reverse source


def test_reverse_source_reverses_words_only():
    src = torch.tensor([[PAD, PAD, 4, 5, 6, EOS], [7, 8, 9, 10, 11, EOS], [PAD, PAD, PAD, PAD, 12, EOS],
                        [PAD, PAD, PAD, PAD, PAD, EOS]])
    before = src.clone()
    expected = torch.tensor([[PAD, PAD, 6, 5, 4, EOS], [11, 10, 9, 8, 7, EOS], [PAD, PAD, PAD, PAD, 12, EOS],
                             [PAD, PAD, PAD, PAD, PAD, EOS]])
    assert torch.equal(reverse_source_tokens(src, PAD, EOS), expected)
    assert torch.equal(src, before)
    right = torch.tensor([[4, 5, 6, EOS, PAD]])
    assert reverse_source_tokens(right, PAD, EOS).tolist() == [[6, 5, 4, EOS, PAD]]


def test_seq2seq_encoder_reads_the_reversed_source_and_leaves_the_input_alone():
    reversing = build("seq2seq_lstm_tiny")
    plain = build("seq2seq_lstm_tiny", reverse_source=False)
    plain.load_state_dict(reversing.state_dict())
    src = sentences([6, 3])
    before = src.clone()
    got = reversing.encoder(src)
    assert torch.equal(src, before)
    want = plain.encoder(reverse_source_tokens(src, PAD, EOS))
    torch.testing.assert_close(got["encoder_h"][0], want["encoder_h"][0])
    assert (got["encoder_h"][0] - plain.encoder(src)["encoder_h"][0]).abs().max() > 1e-3


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("arch,overrides,flag", [
    ("rnnsearch_tiny", {"maxout_dim": 0}, "--maxout-dim"),
    ("rnnencdec_tiny", {"maxout_dim": -2}, "--maxout-dim"),
    ("rnnsearch_tiny", {"decoder_layers": 2}, "--decoder-layers"),
    ("rnnencdec_tiny", {"decoder_layers": 0}, "--decoder-layers"),  # fewer than one too
    ("rnnsearch_tiny", {"attention_hidden_size": 0}, "--attention-hidden-size"),
    ("seq2seq_lstm_tiny", {"decoder_layers": 3}, "--decoder-layers"),
    ("seq2seq_lstm_tiny", {"decoder_layers": 1}, "--decoder-layers"),  # either side larger
])
def test_bad_sizes_fail_at_build_time_with_one_line(arch, overrides, flag):
    with pytest.raises(ConfigError) as err:  # printed without a traceback by fairseq's tools
        build(arch, **overrides)
    assert flag in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("in_features, pool_size", [(5, 2), (0, 2), (-2, 2), (2, 0), (2, -1)])
def test_maxout_rejects_an_input_size_that_is_not_a_positive_multiple_of_the_pool(in_features, pool_size):
    with pytest.raises(ValueError, match=f"maxout input size {in_features} is not a positive multiple "
                                         f"of the pool size {pool_size}$"):
        Maxout(in_features, pool_size)


# ---------------------------------------------------------------- halving schedule


def make_halving(lr=0.7, lrs=None, **cfg):
    """The schedule over an SGD at ``lr``; ``lrs``: the schedule's own --lr list, if not [lr]."""
    from fairseq.optim.lr_scheduler import build_lr_scheduler
    from fairseq.optim.sgd import SGD
    from omegaconf import OmegaConf

    params = [torch.nn.Parameter(torch.zeros(1))]
    opt = SGD(OmegaConf.create({"lr": [lr], "momentum": 0.0, "weight_decay": 0.0}), params)
    conf = {"_name": "sutskever_halving", "halve_after_epochs": 5.0, "halve_every_epochs": 0.5,
            "updates_per_epoch": 0, "lr": [lr] if lrs is None else lrs}
    conf.update(cfg)
    return build_lr_scheduler(OmegaConf.create(conf), opt), opt


def expected_lr(u, U, lr=0.7, after=5):
    """Paper: lr fixed for 5 epochs (``after``), then halved every half epoch (at 5, 5.5, 6, ...)."""
    epochs = u / U
    return lr if epochs < after else lr * 0.5 ** (math.floor((epochs - after) / 0.5) + 1)


def run_halving(sched, opt, epochs, U):
    """What fairseq's trainer calls, in its order: {u: the lr update u + 1 runs with}."""
    seen, u = {}, 0
    for epoch in range(1, epochs + 1):
        sched.step_begin_epoch(epoch)
        sched.step_update(u)
        seen[u] = opt.get_lr()
        for _ in range(U):
            u += 1
            sched.step_update(u)
            seen[u] = opt.get_lr()
        sched.step(epoch)
    return seen


@pytest.mark.parametrize("given", [0, 40])
def test_halving_schedule_follows_the_formula(given):
    U = 40
    sched, opt = make_halving(updates_per_epoch=given)
    seen = run_halving(sched, opt, 12, U)  # past twice the start too
    for u, lr in seen.items():
        assert lr == pytest.approx(expected_lr(u, U)), u
    assert seen[199] == 0.7 and seen[200] == 0.35 and seen[220] == 0.175 and seen[300] == 0.7 / 2 ** 6
    state = sched.state_dict()
    resumed, opt2 = make_halving()
    resumed.load_state_dict(state)
    resumed.step_update(230)
    assert opt2.get_lr() == pytest.approx(expected_lr(230, U))


def test_halving_schedule_needs_updates_per_epoch_to_halve_in_the_first_epoch():
    with pytest.raises(ConfigError, match="--updates-per-epoch"):
        make_halving(halve_after_epochs=0.5)


def test_halving_schedule_measured_in_the_first_epoch_halves_from_the_second():
    """--halve-after-epochs 1 without --updates-per-epoch: the epoch's length, measured when the second
    begins, halves the lr from its first update."""
    sched, opt = make_halving(halve_after_epochs=1.0)
    seen = run_halving(sched, opt, 3, 40)
    assert seen[39] == 0.7 and seen[40] == 0.35 and seen[60] == 0.175
    for u, lr in seen.items():
        assert lr == pytest.approx(expected_lr(u, 40, after=1)), u


def test_halving_schedule_halves_within_the_first_epoch_when_its_length_is_given():
    sched, opt = make_halving(halve_after_epochs=0.5, updates_per_epoch=10)
    for u, lr in ((4, 0.7), (5, 0.35), (10, 0.175)):
        sched.step_update(u)
        assert opt.get_lr() == pytest.approx(lr), u


def test_halving_schedule_resumed_with_another_updates_per_epoch_follows_the_flag():
    """The checkpoint measured 40 updates an epoch; --updates-per-epoch 20 on the resumed run wins."""
    measured, opt = make_halving()
    run_halving(measured, opt, 2, 40)
    resumed, opt = make_halving(updates_per_epoch=20)
    resumed.load_state_dict(measured.state_dict())
    resumed.step_update(100)
    assert opt.get_lr() == pytest.approx(expected_lr(100, 20))


def test_halving_schedule_measures_the_epoch_at_a_later_epoch_too():
    """Resumed at epoch 3 from a checkpoint without the measurement (another scheduler's): 80 updates
    in two epochs are 40 an epoch."""
    sched, opt = make_halving()
    sched.load_state_dict({"best": None})
    sched.step_begin_epoch(3)
    sched.step_update(80)
    for u in (199, 200, 220):
        sched.step_update(u)
        assert opt.get_lr() == pytest.approx(expected_lr(u, 40)), u


@pytest.mark.parametrize("cfg, message", [
    ({"lrs": []}, r"^--lr \[\]: sutskever_halving takes exactly one value"),
    ({"lrs": [0.7, 0.35]}, r"^--lr \[0.7, 0.35\]: sutskever_halving takes exactly one value"),
    ({"halve_every_epochs": 0.0}, "^--halve-every-epochs must be positive, got 0.0"),
    ({"halve_every_epochs": -0.5}, "^--halve-every-epochs must be positive, got -0.5"),
    ({"updates_per_epoch": -1}, "^--updates-per-epoch must be >= 0, got -1"),
])
def test_halving_schedule_refuses_bad_values_in_one_line(cfg, message):
    with pytest.raises(ConfigError, match=message):
        make_halving(**cfg)


def test_halving_schedule_from_the_command_line_is_the_papers():
    """What fairseq-train builds from ``--lr-scheduler sutskever_halving --updates-per-epoch 10`` (its parser
    and builder): the lr is kept for 5 epochs, then halved every half epoch."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.optim.lr_scheduler import build_lr_scheduler
    from fairseq.optim.sgd import SGD
    from omegaconf import OmegaConf

    def build(*flags):
        args = options.parse_args_and_arch(options.get_training_parser(), [
            "data", "--arch", "lstm", "--optimizer", "sgd", "--lr", "0.7", "--lr-scheduler", "sutskever_halving",
            *flags])
        opt = SGD(OmegaConf.create({"lr": [0.7], "momentum": 0.0, "weight_decay": 0.0}),
                  [torch.nn.Parameter(torch.zeros(1))])
        return build_lr_scheduler(convert_namespace_to_omegaconf(args).lr_scheduler, opt), opt

    sched, opt = build("--updates-per-epoch", "10")
    for u, lr in ((0, 0.7), (49, 0.7), (50, 0.35), (54, 0.35), (55, 0.175), (75, 0.7 / 2**6)):
        sched.step_update(u)
        assert opt.get_lr() == pytest.approx(lr), u
    sched, opt = build()  # the epoch measured: the same schedule
    seen = run_halving(sched, opt, 8, 10)
    assert [seen[u] for u in (49, 50, 54, 55, 75)] == pytest.approx([0.7, 0.35, 0.35, 0.175, 0.7 / 2**6])
