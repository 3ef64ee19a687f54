"""vaswani_transformer in-process: the paper's formulas recomputed on tiny tensors, fairseq's
built-in transformer on the same weights, incremental vs full decoding, padding invariance,
Wu et al.'s length penalty, and build-time errors."""
import copy
import math
from argparse import Namespace

import pytest
import torch
import torch.nn.functional as F
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
from fairseq.modules import SinusoidalPositionalEmbedding
from fairseq.sequence_generator import SequenceGenerator

from fairseq_plugins.models.transformer_convert import check_loads, convert_args, convert_state_dict
from fairseq_plugins.errors import ConfigError
from fairseq_plugins.models.transformer import VaswaniTransformerModel
from fairseq_plugins.modules.beam_cache import BeamCache, get_cache
from fairseq_plugins.modules.multihead_attention import MultiheadAttention
from fairseq_plugins.modules.positional_embedding import PositionalEncoding
from fairseq_plugins.modules.transformer_layer import TransformerDecoderLayer, TransformerEncoderLayer
from fairseq_plugins.tasks.translation_wu import (
    TranslationWuConfig,
    TranslationWuTask,
    WuSequenceGenerator,
)
from helpers import pre_2019_layout

TOL = 1e-5


def dictionary(prefix, n=24):
    d = Dictionary()
    for i in range(n):
        d.add_symbol(f"{prefix}{i}")
    return d


JOINED = dictionary("w")
SRC, TGT = dictionary("s", 20), dictionary("t", 27)


def task(src=JOINED, tgt=None):
    return Namespace(source_dictionary=src, target_dictionary=tgt or src)


def build(arch="vaswani_transformer_tiny", src=JOINED, tgt=None, seed=0, **flags):
    torch.manual_seed(seed)
    args = Namespace(arch=arch, **{"dropout": 0.0, **flags})
    ARCH_CONFIG_REGISTRY[arch](args)
    return ARCH_MODEL_REGISTRY[arch].build_model(args, task(src, tgt)).eval()


def tokens(d, lengths, seed=1, left_pad=True):
    """[B, max_len] random sentences ending in EOS, padded with d.pad()."""
    g = torch.Generator().manual_seed(seed)
    out = torch.full((len(lengths), max(lengths)), d.pad())
    for i, n in enumerate(lengths):
        sent = torch.cat([torch.randint(d.nspecial, len(d), (n - 1,), generator=g), torch.tensor([d.eos()])])
        if left_pad:
            out[i, out.size(1) - n:] = sent
        else:
            out[i, :n] = sent
    return out


def prev_output(d, lengths, seed=2):
    """Decoder input: EOS then the target words, right-padded (fairseq's layout)."""
    t = tokens(d, lengths, seed, left_pad=False)
    prev = torch.full_like(t, d.pad())
    for i, n in enumerate(lengths):
        prev[i, 0] = d.eos()
        prev[i, 1:n] = t[i, : n - 1]
    return prev


def log_probs(model, src, prev):
    return model.get_normalized_probs(model(src, None, prev), log_probs=True)


# ---------------------------------------------------------------- positional encodings

@pytest.mark.parametrize("d_model", [6, 7])
def test_paper_positional_encoding_is_the_formula_sin_even_cos_odd(d_model):
    pad = JOINED.pad()
    pe = PositionalEncoding(16, d_model, pad, "paper")
    src = tokens(JOINED, [5, 3])  # second sentence left-padded by 2
    out = pe(src)
    for b, n in ((0, 5), (1, 3)):
        offset = src.size(1) - n
        for pos in range(n):
            for j in range(d_model):
                i = j // 2
                angle = pos / 10000 ** (2 * i / d_model)
                expected = math.sin(angle) if j % 2 == 0 else math.cos(angle)
                assert out[b, offset + pos, j].item() == pytest.approx(expected, abs=1e-6)
        assert out[b, :offset].abs().sum() == 0  # padding gets nothing


def test_fairseq_positional_layout_equals_fairseq_module():
    src = tokens(JOINED, [7, 4, 2])
    ours = PositionalEncoding(32, 8, JOINED.pad(), "fairseq")
    theirs = SinusoidalPositionalEmbedding(8, JOINED.pad(), init_size=32 + JOINED.pad() + 1)
    assert torch.equal(ours(src), theirs(src))
    # one decoding step: the T-th token
    assert torch.equal(ours(src, incremental=True), theirs(src, incremental_state={})[:, -1:])


def test_learned_positions_start_as_fairseqs():
    """fairseq's LearnedPositionalEmbedding: N(0, d^-1/2) rows, the padding row zero."""
    from fairseq.modules import PositionalEmbedding
    d, pad = 512, JOINED.pad()
    torch.manual_seed(0)
    for weight in (PositionalEncoding(1000, d, pad, "learned").weight,
                   PositionalEmbedding(1000, d, pad, learned=True).weight):
        rows = torch.cat([weight[:pad], weight[pad + 1:]]).detach()
        assert weight[pad].abs().max() == 0
        assert rows.std().item() == pytest.approx(d**-0.5, rel=0.01) and abs(rows.mean().item()) < 1e-3


def test_only_learned_positions_are_saved():
    """The sinusoids are computed, not learned: no checkpoint entry (fairseq's layout neither)."""
    saved = {kind: list(PositionalEncoding(8, 4, JOINED.pad(), kind).state_dict())
             for kind in ("paper", "fairseq", "learned")}
    assert saved == {"paper": [], "fairseq": [], "learned": ["weight"]}


def test_a_batch_padded_beyond_the_limit_is_fine_while_its_sentences_are_within_it():
    """Padding to a multiple (fairseq's --required-seq-len-multiple) can make a batch longer than
    its longest sentence: the limit is on sentences."""
    pe = PositionalEncoding(4, 8, JOINED.pad(), "paper")
    for lengths in ([4, 2], [3, 2]):  # the longest at the limit, and under it
        src = tokens(JOINED, lengths)
        padded = torch.cat([torch.full((2, 6 - src.size(1)), JOINED.pad()), src], dim=1)  # 6 columns
        out = pe(padded)
        assert torch.equal(out[:, -src.size(1):], pe(src)) and out[:, :-src.size(1)].abs().max() == 0


def test_position_beyond_maximum_is_a_clear_error():
    pe = PositionalEncoding(4, 8, JOINED.pad(), "paper", flag="--max-source-positions")
    pe(tokens(JOINED, [4, 2]))  # at the limit: fine
    with pytest.raises(ConfigError, match=r"5 tokens .* longer than --max-source-positions 4"):
        pe(tokens(JOINED, [5]))
    model = build(max_source_positions=6, max_target_positions=6)
    with pytest.raises(ConfigError, match="--max-source-positions 6"):
        model.encoder(tokens(JOINED, [9]))
    with pytest.raises(ConfigError, match="--max-target-positions 6"):
        model.decoder(prev_output(JOINED, [7]), model.encoder(tokens(JOINED, [3])), incremental_state={})


# ---------------------------------------------------------------- attention and layers

def reference_attention(attn, query, key, mask=None, causal=False, additive=None, dropout_p=0.0):
    """softmax(Q Kᵀ / √d_k + additive) V per head, Concat, W^O — from the module's weights; with
    ``dropout_p``, one F.dropout on the [B, h, T, S] weights (draws as the module's would)."""
    d, h = attn.embed_dim, attn.num_heads
    d_k = d // h
    if attn.encoder_decoder_attention:
        Wq, bq = attn.q_proj.weight, attn.q_proj.bias
        Wk, Wv = attn.kv_proj.weight.split(d)
        bk, bv = attn.kv_proj.bias.split(d)
    else:
        Wq, Wk, Wv = attn.in_proj.weight.split(d)
        bq, bk, bv = attn.in_proj.bias.split(d)
    probs, values = [], []
    for i in range(h):
        sl = slice(i * d_k, (i + 1) * d_k)
        Q = query @ Wq[sl].T + bq[sl]
        K = key @ Wk[sl].T + bk[sl]
        values.append(key @ Wv[sl].T + bv[sl])
        scores = Q @ K.transpose(-1, -2) / math.sqrt(d_k)
        if mask is not None:
            scores = scores.masked_fill(~mask[:, None, :], float("-inf"))
        if additive is not None:  # [B, 1, T, S]
            scores = scores + additive[:, 0]
        if causal:
            scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
        probs.append(torch.softmax(scores, -1))
    probs = F.dropout(torch.stack(probs, 1), p=dropout_p, training=dropout_p > 0)
    heads = [probs[:, i] @ values[i] for i in range(h)]
    return torch.cat(heads, -1) @ attn.out_proj.weight.T + attn.out_proj.bias


@pytest.mark.parametrize("cross,padded,causal", [(False, False, True), (False, True, False), (True, True, False)],
                         ids=["decoder-self", "encoder-self", "encoder-decoder"])
def test_sdpa_and_explicit_attention_equal_the_formula(cross, padded, causal):
    torch.manual_seed(0)
    attn = MultiheadAttention(8, 2, encoder_decoder_attention=cross, kdim=8).eval()
    query = torch.randn(3, 4, 8)
    key = torch.randn(3, 5, 8) if cross else query
    mask = torch.ones(3, key.size(1), dtype=torch.bool)
    mask[1, :2] = not padded  # left padding of sentence 1
    attn_mask = mask[:, None, None, :] if padded else None
    expected = reference_attention(attn, query, key, mask, causal)
    with torch.no_grad():
        fused, none = attn(query, key, attn_mask=attn_mask, causal=causal)
        explicit, weights = attn(query, key, attn_mask=attn_mask, causal=causal, need_weights=True)
    assert none is None
    assert torch.allclose(fused, expected, atol=TOL) and torch.allclose(explicit, expected, atol=TOL)
    assert torch.allclose(weights.sum(-1), torch.ones(3, 4), atol=TOL)
    if padded:
        assert weights[1, :, :2].abs().max() == 0  # no weight on padding
    if causal:
        assert weights[:, 0, 1:].abs().max() == 0  # no weight on the future


def test_an_additive_mask_is_added_to_the_scores_on_both_paths():
    """The decoding cache's self-attention mask is additive (0 or -inf); any finite bias adds too."""
    torch.manual_seed(0)
    attn = MultiheadAttention(8, 2).eval()
    query = torch.randn(3, 4, 8)
    additive = torch.randn(3, 1, 4, 4)
    additive[0, 0, :, 1] = float("-inf")
    expected = reference_attention(attn, query, query, additive=additive)
    with torch.no_grad():
        fused, _ = attn(query, attn_mask=additive)
        explicit, weights = attn(query, attn_mask=additive, need_weights=True)
    assert torch.allclose(fused, expected, atol=TOL) and torch.allclose(explicit, expected, atol=TOL)
    assert weights[0, :, 1].abs().max() == 0


def test_attention_dropout_drops_in_training_and_with_retain_dropout_only():
    torch.manual_seed(0)
    query = torch.randn(3, 4, 8)
    plain = MultiheadAttention(8, 2)  # no dropout unless asked
    attn = MultiheadAttention(8, 2, dropout=0.5)
    attn.load_state_dict(plain.state_dict())
    expected = reference_attention(attn, query, query)
    with torch.no_grad():
        for need_weights in (False, True):
            assert torch.allclose(plain.train()(query, need_weights=need_weights)[0], expected, atol=TOL)
            assert torch.allclose(attn.eval()(query, need_weights=need_weights)[0], expected, atol=TOL)
        attn.train()
        torch.manual_seed(3)
        explicit, _ = attn(query, need_weights=True)
        torch.manual_seed(3)
        assert torch.allclose(explicit, reference_attention(attn, query, query, dropout_p=0.5), atol=TOL)
        assert not torch.allclose(explicit, expected, atol=1e-3)
        assert not torch.allclose(attn(query)[0], expected, atol=1e-3)  # the fused kernel drops too
        attn.eval()
        attn.dropout_module.apply_during_inference = True  # fairseq's --retain-dropout
        for need_weights in (False, True):
            assert not torch.allclose(attn(query, need_weights=need_weights)[0], expected, atol=1e-3)


def assert_xavier_uniform(w, gain, fan_in):
    """``w`` [fan_out, fan_in] drawn from U(-a, a), a = Xavier's bound: its largest value near a, its
    standard deviation a/√3 (hundreds of thousands of draws: both within 1-2%)."""
    bound = gain * math.sqrt(6 / (fan_in + w.size(0)))  # Xavier: gain·√(6 / (fan_in + fan_out))
    assert w.size(1) == fan_in and 0.99 * bound < w.abs().max() <= bound
    assert abs(w.std() / (bound / math.sqrt(3)) - 1) < 0.02


@pytest.mark.parametrize("cross, kdim", [(False, 512), (True, 512), (True, 384), (True, 640)],
                         ids=["self", "encoder-decoder", "encoder-decoder-smaller-keys", "encoder-decoder-larger-keys"])
def test_projections_start_as_in_fairseq_xavier_per_matrix(cross, kdim):
    """fairseq's MultiheadAttention initialises W^Q, W^K and W^V each on its own [d, d_in] matrix,
    with gain 1/√2 where keys have the queries' size (gain 1 otherwise), and W^O with gain 1 and a
    zero bias; checked on fairseq's module too."""
    from fairseq.modules import MultiheadAttention as FairseqMultiheadAttention
    d = 512
    gain = 2**-0.5 if kdim == d else 1.0
    torch.manual_seed(0)
    ours = MultiheadAttention(d, 8, encoder_decoder_attention=cross, kdim=kdim)
    theirs = FairseqMultiheadAttention(d, 8, kdim=kdim, vdim=kdim, encoder_decoder_attention=cross,
                                       self_attention=not cross)
    if cross:
        w_k, w_v = ours.kv_proj.weight.split(d)
        projections = [(ours.q_proj.weight, d), (w_k, kdim), (w_v, kdim)]
    else:
        projections = [(w, d) for w in ours.in_proj.weight.split(d)]
    for (w, fan_in), theirs_w in zip(projections, (theirs.q_proj.weight, theirs.k_proj.weight, theirs.v_proj.weight)):
        assert_xavier_uniform(w.detach(), gain, fan_in)
        assert_xavier_uniform(theirs_w.detach(), gain, fan_in)
    for out in (ours.out_proj, theirs.out_proj):
        assert_xavier_uniform(out.weight.detach(), 1.0, d)
        assert out.bias.abs().max() == 0


def test_embeddings_and_an_untied_output_projection_start_as_fairseqs():
    """N(0, d_model^-1/2) with a zero padding row, as fairseq's transformer (its ``Embedding``);
    an untied pre-softmax projection N(0, d_model^-1/2) too."""
    d = 256
    model = build(src=SRC, tgt=TGT, encoder_embed_dim=d, decoder_embed_dim=d, encoder_attention_heads=4)
    assert model.decoder.output_projection.weight is not model.decoder.embed_tokens.weight
    for w in (model.encoder.embed_tokens.weight, model.decoder.embed_tokens.weight,
              model.decoder.output_projection.weight):
        rows = torch.ones(w.size(0), dtype=torch.bool)
        if w is not model.decoder.output_projection.weight:
            assert w[SRC.pad()].abs().max() == 0
            rows[SRC.pad()] = False
        values = w.detach()[rows]
        assert values.std().item() == pytest.approx(d**-0.5, rel=0.1)
        assert abs(values.mean().item()) < 0.1 * d**-0.5


def test_heads_must_divide_the_embedding():
    with pytest.raises(ConfigError, match="embedding dimension 10 is not divisible by the number of attention heads 3"):
        MultiheadAttention(10, 3)


@pytest.mark.parametrize("device, grad, autocast, fused", [
    ("cpu", True, False, True), ("cpu", False, True, True), ("cpu", True, True, False), ("meta", True, True, True)],
    ids=["cpu-training", "cpu-autocast-inference", "cpu-autocast-training", "other-device-autocast-training"])
def test_only_autocast_training_on_a_cpu_takes_the_explicit_attention(monkeypatch, device, grad, autocast, fused):
    """torch 2.13's fused attention backward in bf16 ran 3-10x slower than the explicit one on a CPU
    (reports/benchmarks/README.md); everywhere else, the fused kernel."""
    calls = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or sdpa(*a, **k))
    attn = MultiheadAttention(8, 2).to(device)
    with torch.set_grad_enabled(grad), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out, _ = attn(torch.randn(3, 4, 8, device=device))
    assert out.shape == (3, 4, 8) and len(calls) == int(fused)


@pytest.mark.parametrize("normalize_before", [False, True])
def test_encoder_layer_is_post_ln_sublayers_of_the_paper(normalize_before):
    torch.manual_seed(0)
    layer = TransformerEncoderLayer(8, 16, 2, dropout=0.0, normalize_before=normalize_before).eval()
    x = torch.randn(2, 5, 8)

    def ffn(y):  # max(0, x W_1 + b_1) W_2 + b_2
        return torch.relu(y @ layer.fc1.weight.T + layer.fc1.bias) @ layer.fc2.weight.T + layer.fc2.bias

    ln1, ln2 = layer.self_attn_layer_norm, layer.final_layer_norm
    if normalize_before:  # x + Sublayer(LayerNorm(x))
        y = x + reference_attention(layer.self_attn, ln1(x), ln1(x))
        expected = y + ffn(ln2(y))
    else:  # LayerNorm(x + Sublayer(x))
        y = ln1(x + reference_attention(layer.self_attn, x, x))
        expected = ln2(y + ffn(y))
    with torch.no_grad():
        assert torch.allclose(layer(x, None), expected, atol=TOL)


def test_decoder_layer_masks_future_and_attends_encoder():
    torch.manual_seed(0)
    layer = TransformerDecoderLayer(8, 16, 2, dropout=0.0).eval()
    x, enc = torch.randn(2, 4, 8), torch.randn(2, 6, 8)
    y = layer.self_attn_layer_norm(x + reference_attention(layer.self_attn, x, x, causal=True))
    z = layer.encoder_attn_layer_norm(y + reference_attention(layer.encoder_attn, y, enc))
    ffn = torch.relu(z @ layer.fc1.weight.T + layer.fc1.bias) @ layer.fc2.weight.T + layer.fc2.bias
    with torch.no_grad():
        out, _ = layer(x, enc, None)
    assert torch.allclose(out, layer.final_layer_norm(z + ffn), atol=TOL)


def test_layers_default_to_the_papers_regularisation_and_post_ln():
    """§5.4: P_drop = 0.1 on every sub-layer's output, nothing said of dropout elsewhere (none);
    §3.1: LayerNorm(x + Sublayer(x)); attention weights only when asked."""
    encoder, decoder = TransformerEncoderLayer(8, 16, 2), TransformerDecoderLayer(8, 16, 2)
    for layer in (encoder, decoder):
        assert layer.dropout_module.p == 0.1 and layer.activation_dropout_module.p == 0.0
        assert layer.self_attn.dropout_module.p == 0.0 and not layer.normalize_before
    assert decoder.encoder_attn.dropout_module.p == 0.0
    with torch.no_grad():
        _, attn = decoder.eval()(torch.randn(2, 4, 8), torch.randn(2, 6, 8), None)
    assert attn is None


def test_embeddings_scaled_by_sqrt_d_model_plus_sinusoids():
    model = build()
    src = tokens(JOINED, [6, 3])
    seen = {}
    model.encoder.layers[0].register_forward_pre_hook(lambda m, inputs: seen.update(x=inputs[0]))
    with torch.no_grad():
        model.encoder(src)
    d = model.encoder.embed_tokens.embedding_dim
    expected = math.sqrt(d) * model.encoder.embed_tokens.weight[src] + model.encoder.embed_positions(src)
    assert torch.allclose(seen["x"], expected, atol=TOL)
    # one matrix for source and target embeddings and the pre-softmax projection
    shared = build(share_all_embeddings=True)
    assert shared.encoder.embed_tokens.weight is shared.decoder.embed_tokens.weight
    assert shared.decoder.output_projection.weight is shared.decoder.embed_tokens.weight


def test_architectures_have_the_papers_sizes():
    def args_of(arch):
        a = Namespace(arch=arch)
        ARCH_CONFIG_REGISTRY[arch](a)
        return a

    base, big = args_of("vaswani_transformer_base"), args_of("vaswani_transformer_big")
    assert (base.encoder_layers, base.encoder_embed_dim, base.encoder_ffn_embed_dim,
            base.encoder_attention_heads, base.dropout) == (6, 512, 2048, 8, 0.1)
    assert (big.decoder_layers, big.decoder_embed_dim, big.decoder_ffn_embed_dim,
            big.decoder_attention_heads, big.dropout) == (6, 1024, 4096, 16, 0.3)
    assert not base.encoder_normalize_before and not base.fairseq_positions


# ---------------------------------------------------------------- fairseq's transformer on the same weights

def builtin(src, tgt, **flags):
    torch.manual_seed(3)
    args = Namespace(**{"arch": "transformer", "encoder_layers": 2, "decoder_layers": 2, "encoder_embed_dim": 16,
                        "encoder_ffn_embed_dim": 32, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
                        "dropout": 0.0, "max_source_positions": 64, "max_target_positions": 64, **flags})
    ARCH_CONFIG_REGISTRY["transformer"](args)
    return ARCH_MODEL_REGISTRY["transformer"].build_model(args, task(src, tgt)).eval(), args


def to_old_format(state):
    """The layout of checkpoints before 2019, with the output projection as ``embed_out``."""
    old = pre_2019_layout(state)
    if "decoder.output_projection.weight" in old:
        old["decoder.embed_out"] = old.pop("decoder.output_projection.weight")
    return old


@pytest.mark.parametrize("flags,src,tgt,old_format", [
    (dict(share_all_embeddings=True), JOINED, JOINED, False),
    (dict(encoder_normalize_before=True, decoder_normalize_before=True, encoder_learned_pos=True,
          decoder_learned_pos=True), SRC, TGT, False),
    (dict(share_decoder_input_output_embed=True, decoder_embed_dim=24, decoder_ffn_embed_dim=48), SRC, TGT, False),
    (dict(), SRC, TGT, True),
], ids=["shared-post-ln", "pre-ln-learned-pos", "tied-decoder-other-dim", "old-checkpoint-layout"])
def test_converted_builtin_transformer_gives_the_same_log_probs(flags, src, tgt, old_format):
    fairseq_model, args = builtin(src, tgt, **flags)
    state = fairseq_model.state_dict()
    new_args = convert_args(args)
    ours = VaswaniTransformerModel.build_model(copy.copy(new_args), task(src, tgt)).eval()
    ours.load_state_dict(convert_state_dict(to_old_format(state) if old_format else state, new_args))
    src_tokens, prev = tokens(src, [9, 4, 6]), prev_output(tgt, [7, 8, 3])
    src_lengths = src_tokens.ne(src.pad()).sum(1)
    with torch.no_grad():
        expected = fairseq_model.get_normalized_probs(fairseq_model(src_tokens, src_lengths, prev), log_probs=True)
        got = log_probs(ours, src_tokens, prev)
    real = prev.ne(tgt.pad())
    assert (got - expected)[real].abs().max() < TOL


@pytest.mark.parametrize("beam", [1, 4, 8])
def test_converted_builtin_transformer_generates_the_same_hypotheses(beam):
    """Beam search with fairseq's own generator: ours (its decoding cache) and fairseq's
    ``transformer`` (its own incremental state) on the same weights, with alignments."""
    fairseq_model, args = builtin(SRC, TGT, share_decoder_input_output_embed=True)
    with torch.no_grad():
        for p in fairseq_model.parameters():  # outputs that are not all EOS
            p.normal_(0.0, 0.3)
    new_args = convert_args(args)
    ours = VaswaniTransformerModel.build_model(copy.copy(new_args), task(SRC, TGT)).eval()
    ours.load_state_dict(convert_state_dict(fairseq_model.state_dict(), new_args))
    src_tokens = tokens(SRC, [9, 4, 6, 11], seed=7)
    sample = {"net_input": {"src_tokens": src_tokens, "src_lengths": src_tokens.ne(SRC.pad()).sum(1)}}
    hypos = []
    for model in (ours, fairseq_model):
        model.decoder.need_attn = True  # what --print-alignment sets (prepare_for_inference_)
        generator = SequenceGenerator([model], TGT, beam_size=beam, max_len_b=12)
        with torch.no_grad():
            hypos.append(generator.generate([model], sample))
    words = 0
    for ours_hypos, theirs_hypos in zip(*hypos):
        for a, b in zip(ours_hypos, theirs_hypos):
            assert torch.equal(a["tokens"], b["tokens"])
            assert abs(a["score"].item() - b["score"].item()) < TOL
            assert (a["attention"] - b["attention"]).abs().max() < TOL
            words += a["tokens"].numel()
    assert words > 2 * src_tokens.size(0)


def test_converted_builtin_transformer_aligns_with_the_same_layer():
    """Three decoder layers: the converted model's attention (what --print-alignment prints) is
    fairseq's, the last layer's, not another's."""
    fairseq_model, args = builtin(SRC, TGT, decoder_layers=3)
    new_args = convert_args(args)
    ours = VaswaniTransformerModel.build_model(copy.copy(new_args), task(SRC, TGT)).eval()
    ours.load_state_dict(convert_state_dict(fairseq_model.state_dict(), new_args))
    src_tokens, prev = tokens(SRC, [9, 4, 6]), prev_output(TGT, [7, 8, 3])
    with torch.no_grad():
        expected = fairseq_model(src_tokens, src_tokens.ne(SRC.pad()).sum(1), prev)[1]["attn"][0]
        got = ours(src_tokens, None, prev)[1]["attn"][0]
    real = prev.ne(TGT.pad())
    assert (got - expected)[real].abs().max() < TOL


def test_converter_reads_fairseqs_nested_transformer_config():
    """A checkpoint whose cfg.model is fairseq's TransformerConfig (``encoder``/``decoder`` sub-configs,
    as hydra-train writes it) converts to the options of the same model's flat form."""
    from fairseq.models.transformer import TransformerConfig
    from omegaconf import OmegaConf

    _, args = builtin(SRC, TGT, decoder_layers=3, encoder_normalize_before=True, decoder_learned_pos=True,
                      decoder_embed_dim=24, decoder_ffn_embed_dim=48)
    nested = OmegaConf.structured(TransformerConfig.from_namespace(args))
    nested._name = "transformer"
    # as a checkpoint's cfg keeps them: interpolations into the whole config, resolved on reading
    nested.decoder.input_dim = nested.decoder.output_dim = "${model.decoder.embed_dim}"
    flat, from_nested = convert_args(args), convert_args(OmegaConf.create({"model": nested}).model)
    flags = [f"{side}_{name}" for side in ("encoder", "decoder")
             for name in ("layers", "embed_dim", "ffn_embed_dim", "attention_heads", "normalize_before", "learned_pos")]
    flags += ["dropout", "attention_dropout", "activation_dropout", "share_all_embeddings",
              "share_decoder_input_output_embed", "max_source_positions", "max_target_positions", "fairseq_positions"]
    assert {f: getattr(from_nested, f) for f in flags} == {f: getattr(flat, f) for f in flags}
    assert (from_nested.decoder_layers, from_nested.decoder_embed_dim, from_nested.encoder_normalize_before,
            from_nested.decoder_learned_pos) == (3, 24, True, True)


def test_converter_reads_the_old_name_of_the_activation_dropout():
    """Checkpoints before fairseq renamed --relu-dropout keep only relu_dropout; later ones keep
    activation_dropout, whatever relu_dropout says."""
    _, args = builtin(SRC, TGT)
    del args.activation_dropout
    args.relu_dropout = 0.2
    assert convert_args(args).activation_dropout == 0.2
    args.activation_dropout = 0.3
    assert convert_args(args).activation_dropout == 0.3


def test_converter_refuses_what_it_cannot_reproduce():
    _, args = builtin(JOINED, JOINED, activation_fn="gelu")
    with pytest.raises(Exception, match="activation_fn='gelu'"):
        convert_args(args)
    for arch in ("lstm", "vaswani_transformer", "transformer_lm"):  # another family, ours, a language model
        with pytest.raises(Exception, match=f"^architecture '{arch}' is not of fairseq's 'transformer' family$"):
            convert_args(Namespace(arch=arch))
    for option in ("decoder_input_dim", "decoder_output_dim"):
        for size in (8, 32):  # the decoder's embedding is 16 wide
            _, args = builtin(JOINED, JOINED, **{option: size})
            with pytest.raises(Exception, match="decoder_input_dim/decoder_output_dim differ from decoder_embed_dim 16"):
                convert_args(args)
    fairseq_model, args = builtin(JOINED, JOINED)
    state = dict(fairseq_model.state_dict(), **{"encoder.layernorm_embedding.weight": torch.ones(16)})
    with pytest.raises(Exception, match=r"^parameter encoder.layernorm_embedding.weight \(and 0 more\) has no "
                                        "counterpart in vaswani_transformer$"):
        convert_state_dict(state, convert_args(args))
    state["encoder.layernorm_embedding.bias"] = torch.zeros(16)
    with pytest.raises(Exception, match=r"^parameter encoder.layernorm_embedding.bias \(and 1 more\)"):
        convert_state_dict(state, convert_args(args))


def test_converter_checks_that_the_converted_weights_load_strictly():
    """The converter's last check builds the model and loads its weights strictly: a parameter too
    few or too many is an error there, not a model that loads with some weights left at random."""
    fairseq_model, args = builtin(SRC, TGT)
    new_args = convert_args(args)
    state = convert_state_dict(fairseq_model.state_dict(), new_args)
    check_loads(state, new_args)
    with pytest.raises(RuntimeError, match='Missing key.*"decoder.layers.1.fc2.bias"'):
        check_loads({k: v for k, v in state.items() if k != "decoder.layers.1.fc2.bias"}, new_args)
    with pytest.raises(RuntimeError, match='Unexpected key.*"decoder.extra"'):
        check_loads(dict(state, **{"decoder.extra": torch.zeros(1)}), new_args)


# ---------------------------------------------------------------- incremental decoding

def step_by_step(model, encoder_out, prev, incremental_state, start, stop):
    outs = []
    for t in range(start, stop):
        logits, extra = model.decoder(prev[:, : t + 1], encoder_out, incremental_state)
        outs.append((model.get_normalized_probs((logits, None), log_probs=True), extra["attn"][0]))
    return torch.cat([o[0] for o in outs], 1), torch.cat([o[1] for o in outs], 1)


@pytest.mark.parametrize("lengths", [[7, 3, 5], [6, 6, 6]], ids=["padded", "no-padding"])
def test_reorder_encoder_out_puts_every_tensor_in_the_orders_rows(lengths):
    """fairseq's contract, which its own transformer and lstm keep: after
    ``reorder_encoder_out(out, order)`` row n of every tensor is the fresh output's row order[n]
    (repeated and dropped rows included), so anything reading ``encoder_out`` afterwards (an
    ensemble, a third-party generator, a full forward of the decoder) sees the right rows."""
    model = build(share_all_embeddings=True)
    src = tokens(JOINED, lengths)
    prev = prev_output(JOINED, [5, 5, 5])
    with torch.no_grad():
        fresh = model.encoder(src)
        out, rows = fresh, torch.arange(3)
        for order in (torch.tensor([0, 0, 1, 1, 2, 2]), torch.tensor([1, 0, 3, 3, 5, 4]),
                      torch.tensor([5, 0, 2])):  # beam-like, then rows dropped and crossing
            out = model.encoder.reorder_encoder_out(out, order)
            rows = rows[order]
            assert out.keys() >= fresh.keys()
            assert all(t.size(0) == len(rows) for tensors in out.values() for t in tensors)  # "beam_size" too
            for key in fresh:
                assert len(out[key]) == len(fresh[key])
                for got, expected in zip(out[key], fresh[key]):
                    assert torch.equal(got, expected.index_select(0, rows)), key
            # a consumer: the decoder's full forward over the reordered output
            logits, _ = model.decoder(prev[rows], out)
            assert (logits - model(src[rows], None, prev[rows])[0]).abs().max() < TOL


@pytest.mark.parametrize("flags", [dict(), dict(encoder_normalize_before=True, decoder_normalize_before=True)])
def test_incremental_decoding_equals_full_forward_under_any_reorder(flags):
    """No beam size set (groups of one): any order a generator gives (rows repeated, dropped,
    crossing sentences), as fairseq drives it: reorder the incremental state and the encoder
    output with the same order, then step. Every step equals a full forward of the same rows."""
    model = build(share_all_embeddings=True, **flags)
    src = tokens(JOINED, [7, 3, 5])
    prev = prev_output(JOINED, [7, 7, 7])
    orders = [torch.tensor([0, 0, 1, 1, 2, 2]), torch.tensor([1, 0, 2, 3, 5, 4]),
              torch.tensor([4, 1, 0, 5, 3, 2]), torch.tensor([2, 2, 5, 0]), torch.tensor([3, 0])]
    with torch.no_grad():
        encoder_out = model.encoder(src)
        _, full_extra = model(src, None, prev)
        state, rows = {}, torch.arange(3)
        lp, attn = step_by_step(model, encoder_out, prev, state, 0, 2)
        full = log_probs(model, src, prev[:, :2])
        assert (lp - full).abs().max() < TOL
        assert (attn - full_extra["attn"][0][:, :2]).abs().max() < TOL
        for t, order in enumerate(orders, start=2):
            rows = rows[order]
            model.decoder.reorder_incremental_state_scripting(state, order)
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, order)
            lp, attn = step_by_step(model, encoder_out, prev[rows], state, t, t + 1)
            full = log_probs(model, src[rows], prev[rows, : t + 1])
            assert (lp - full[:, t:]).abs().max() < TOL, t
            assert (attn - full_extra["attn"][0][rows, t:t + 1]).abs().max() < TOL, t


def self_attn_buffers(model, state):
    cache = get_cache(model.decoder, state)
    attentions = [cache.self_attention(layer.self_attn.layer) for layer in model.decoder.layers]
    return [t for attention in attentions for t in (attention.keys, attention.values)]


def encoder_kv(model, state):
    cache = get_cache(model.decoder, state)
    return [t for name, t in cache.per_beam.items() if ".encoder_attn." in name]


@pytest.mark.parametrize("flags", [dict(), dict(encoder_normalize_before=True, decoder_normalize_before=True)])
def test_beam_decoding_equals_full_forward_and_moves_no_cache_within_beams(flags):
    """Beam search as SequenceGenerator drives it: rows repeated per beam before the first step, reorders within beams (hypotheses repeated and dropped), finished sentences dropped;
    every step equals a full forward of the same rows. The encoder keys/values are computed once
    per sentence, within-beam reorders move no cache entry, and past the preallocated capacity
    (16 steps) the self-attention buffer grows."""
    model = build(share_all_embeddings=True, **flags)
    src = tokens(JOINED, [7, 3, 5])
    prev = prev_output(JOINED, [24, 24, 24])
    beam = torch.tensor([0, 0, 1, 1, 2, 2])
    orders = ([torch.tensor([1, 1, 2, 3, 5, 4]), torch.tensor([0, 1, 2, 3, 4, 5]), torch.tensor([1, 0, 3, 3, 4, 4])] * 5
              + [torch.tensor([0, 1, 5, 4]),  # sentence 1 finished: beams 0 and 2 remain
                 torch.tensor([1, 0, 3, 2]), torch.tensor([1, 1, 2, 3]), torch.tensor([1, 1, 2, 2]),
                 torch.tensor([3, 2])])  # sentence 0 finished
    with torch.no_grad():
        encoder_out = model.encoder.reorder_encoder_out(model.encoder(src), beam)
        rows, state = beam, {}
        lp, _ = step_by_step(model, encoder_out, prev[rows], state, 0, 1)
        assert (lp - log_probs(model, src[rows], prev[rows, :1])).abs().max() < TOL
        assert all(kv.size(0) == 3 for kv in encoder_kv(model, state))  # once per sentence
        for t, order in enumerate(orders, start=1):
            buffers = [b.data_ptr() for b in self_attn_buffers(model, state)]
            model.decoder.reorder_incremental_state_scripting(state, order)
            if order.numel() == rows.numel() and 1 < t < 16:  # within-beam reorders copy no cache entry
                assert [b.data_ptr() for b in self_attn_buffers(model, state)] == buffers
            rows = rows[order]
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, order)
            lp, attn = step_by_step(model, encoder_out, prev[rows], state, t, t + 1)
            full = log_probs(model, src[rows], prev[rows, : t + 1])
            assert (lp - full[:, t:]).abs().max() < TOL, t
        assert self_attn_buffers(model, state)[0].size(2) == 32  # grew once, from 16 (time is dim 2)
        assert all(kv.size(0) == 1 for kv in encoder_kv(model, state))


def test_greedy_decoding_after_a_beam_search_on_the_same_model():
    """The beam layout belongs to one decoding (its encoder output), not to the model: fairseq's
    hub translate(beam=1) after translate(beam=4) decodes four sentences as four sentences."""
    model = build(share_all_embeddings=True)
    src, prev = tokens(JOINED, [7, 3, 5, 4]), prev_output(JOINED, [4, 4, 4, 4])
    SequenceGenerator([model], model.decoder.dictionary, beam_size=4)  # what a beam-4 translate() builds
    with torch.no_grad():
        beams = model.encoder.reorder_encoder_out(model.encoder(src), torch.arange(4).repeat_interleave(4))
        model.decoder(prev.repeat_interleave(4, 0)[:, :1], beams, {})
        greedy = model.encoder.reorder_encoder_out(model.encoder(src), torch.arange(4))
        lp, _ = step_by_step(model, greedy, prev, {}, 0, 3)
        assert (lp - log_probs(model, src, prev[:, :3])).abs().max() < TOL


def test_beam_cache_self_attention_equals_naive_cat_reference():
    """One self-attention module on a BeamCache in beams of 3 (entries written in place, read
    through the slot mask) against keys/values kept the naive way, concatenated per step and
    index_select-ed per reorder."""
    model = build(share_all_embeddings=True)
    attn = model.decoder.layers[0].self_attn
    g = torch.Generator().manual_seed(3)
    group, n = 3, 6
    cache = BeamCache(n, group)
    attn.start_cache(cache, torch.zeros(1))
    cache.per_beam["unused"] = torch.zeros(n // group)  # something shared: the beam layout's fast path
    ref_kv = None
    x = torch.randn(n, 1, 64, generator=g)
    with torch.no_grad():
        for t in range(20):
            if t > 0:
                order = torch.randint(0, group, (n,), generator=g) + torch.arange(n) // group * group
                if t == 13:
                    order, n = order[3:], 3  # the first beam finished
                cache.reorder(order)
                ref_kv = ref_kv.index_select(0, order)
                x = x[order] + torch.randn(n, 1, 64, generator=g)
            cache.begin_step()
            out, _ = attn(x, cache=cache)
            qkv = attn.in_proj(x).view(n, 1, 3, 4, 16).permute(0, 2, 3, 1, 4)  # [N, 3, h, 1, d_k]
            ref_kv = qkv[:, 1:] if ref_kv is None else torch.cat([ref_kv, qkv[:, 1:]], dim=3)
            scores = qkv[:, 0] @ ref_kv[:, 0].transpose(-2, -1) / 4.0  # QKᵀ/√d_k
            ref = attn.out_proj((scores.softmax(-1) @ ref_kv[:, 1]).transpose(1, 2).reshape(n, 1, 64))
            assert (out - ref).abs().max() < TOL, t
        assert cache.beam_size == group


# ---------------------------------------------------------------- padding invariance

def test_scores_and_translation_do_not_depend_on_the_batch():
    model = build(share_all_embeddings=True, seed=4)
    batch = tokens(JOINED, [3, 11, 8], seed=5)  # sentence 0 is left-padded by 8
    alone = batch[:1, -3:]
    prev = prev_output(JOINED, [5, 9, 4], seed=6)
    with torch.no_grad():
        lp_batch = log_probs(model, batch, prev)
        lp_alone = log_probs(model, alone, prev[:1, :5])
        assert (lp_batch[0, :5] - lp_alone[0]).abs().max() < TOL
        gen = SequenceGenerator([model], JOINED, beam_size=4, max_len_b=12)
        in_batch = gen.generate([model], {"net_input": {"src_tokens": batch, "src_lengths": batch.ne(1).sum(1)}})
        by_itself = gen.generate([model], {"net_input": {"src_tokens": alone, "src_lengths": torch.tensor([3])}})
    for a, b in zip(in_batch[0], by_itself[0]):
        assert torch.equal(a["tokens"], b["tokens"])
        assert a["score"].item() == pytest.approx(b["score"].item(), abs=TOL)


# ---------------------------------------------------------------- Wu et al.'s length penalty

def test_wu_length_penalty_scores_are_log_prob_over_lp():
    model = build(share_all_embeddings=True, seed=7)
    src = tokens(JOINED, [6, 4, 9], seed=8)
    alpha = 0.6
    gen = WuSequenceGenerator([model], JOINED, beam_size=4, max_len_b=10, wu_alpha=alpha)
    with torch.no_grad():
        hypos = gen.generate([model], {"net_input": {"src_tokens": src, "src_lengths": src.ne(1).sum(1)}})
        for i, sentence in enumerate(hypos):
            assert len(sentence) == 4
            scores = [h["score"].item() for h in sentence]
            assert scores == sorted(scores, reverse=True)  # ranked by log P / lp
            for h in sentence:
                y = h["tokens"]  # ends with EOS
                prev = torch.cat([torch.tensor([JOINED.eos()]), y[:-1]])[None]
                lp = log_probs(model, src[i: i + 1], prev)[0]
                log_p = lp.gather(1, y[:, None]).sum().item()  # log P(Y|X) by a full forward
                penalty = ((5 + len(y)) / 6) ** alpha  # lp(Y) = (5 + |Y|)^α / (5 + 1)^α
                assert h["score"].item() == pytest.approx(log_p / penalty, abs=1e-4)


def test_wu_task_refuses_fairseqs_lenpen():
    wu_task = TranslationWuTask(TranslationWuConfig(), JOINED, JOINED)
    model = build(share_all_embeddings=True)
    assert isinstance(wu_task.build_generator([model], Namespace(beam=4)), WuSequenceGenerator)
    with pytest.raises(ConfigError, match="--lenpen 2.0 does not apply.*--wu-lenpen"):
        wu_task.build_generator([model], Namespace(beam=4, lenpen=2.0))


# ---------------------------------------------------------------- build-time errors

def test_build_errors_name_the_flag():
    with pytest.raises(ConfigError, match="--share-all-embeddings needs a joined dictionary"):
        build(src=SRC, tgt=TGT, share_all_embeddings=True)
    with pytest.raises(ConfigError, match="--encoder-embed-dim 64 is not divisible by --encoder-attention-heads 3"):
        build(encoder_attention_heads=3)
    with pytest.raises(ConfigError, match="--alignment-layer 5"):
        build(alignment_layer=5)
    for encoder, decoder in ((64, 32), (32, 64)):
        with pytest.raises(ConfigError, match=rf"--share-all-embeddings needs --encoder-embed-dim \({encoder}\) == "
                                              rf"--decoder-embed-dim \({decoder}\)"):
            build(share_all_embeddings=True, encoder_embed_dim=encoder, decoder_embed_dim=decoder)


def test_alignment_layer_counts_from_either_end_and_refuses_the_layers_it_has_not():
    """--alignment-layer L of the tiny model's 2 decoder layers: 0 and 1, or -2 and -1 from the top;
    2 and -3 are refused (taken modulo 2 they would silently pick a layer)."""
    src, prev = tokens(JOINED, [5, 4]), prev_output(JOINED, [4, 4])
    attn = {}
    for layer in (-2, -1, 0, 1):
        model = build(share_all_embeddings=True, alignment_layer=layer)  # the same weights every time
        with torch.no_grad():
            attn[layer] = model(src, None, prev)[1]["attn"][0]
    assert torch.equal(attn[-2], attn[0]) and torch.equal(attn[-1], attn[1])
    assert not torch.allclose(attn[0], attn[1])
    for layer in (2, -3):
        with pytest.raises(ConfigError, match=f"--alignment-layer {layer} is outside the 2 decoder layers"):
            build(share_all_embeddings=True, alignment_layer=layer)


def test_training_mode_skips_attention_weights_and_applies_dropout():
    model = build(share_all_embeddings=True)
    model.train()
    for layer in model.decoder.layers:
        layer.dropout_module.p = 0.5
    src, prev = tokens(JOINED, [5, 4]), prev_output(JOINED, [4, 4])
    out1, extra = model(src, None, prev)
    out2, _ = model(src, None, prev)
    assert extra["attn"] == [None]
    assert not torch.allclose(out1, out2)
    F.log_softmax(out1, -1).sum().backward()  # differentiable end to end
    assert model.encoder.embed_tokens.weight.grad is not None


# ---------------------------------------------------------------- activation checkpointing

def train_step(flags, dropout=0.0, bf16=False):
    """Loss, parameter gradients and bytes of activations saved for backward of one training
    forward/backward of a fresh model (same weights and dropout masks for every ``flags``)."""
    model = build(share_all_embeddings=True, dropout=dropout, **flags).train()
    src, prev = tokens(JOINED, [9, 4, 7]), prev_output(JOINED, [8, 8, 5])
    params = {p.data_ptr() for p in model.parameters()}
    saved = {}  # storage -> bytes: what autograd keeps besides the weights

    def pack(t):
        if t.data_ptr() not in params:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    torch.manual_seed(5)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits, _ = model(src, None, prev)
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens(JOINED, [8, 8, 5], left_pad=False).flatten(),
                               ignore_index=JOINED.pad())
    loss.backward()
    return loss, {n: p.grad for n, p in model.named_parameters()}, sum(saved.values())


@pytest.mark.parametrize("dropout, bf16", [(0.0, False), (0.3, False), (0.0, True)],
                         ids=["fp32", "dropout", "bf16-autocast"])
def test_checkpoint_activations_same_loss_and_gradients_less_saved(dropout, bf16):
    """Tolerance 0: torch's non-reentrant checkpoint keeps the autograd graph and recomputes
    each layer with the same kernels on the same inputs, under the same autocast and RNG state
    (same dropout masks), so every number is the same bit for bit."""
    loss, grads, saved = train_step({}, dropout, bf16)
    saved_by = {}
    for flag in ("checkpoint_activations", "offload_activations"):
        loss_ck, grads_ck, saved_by[flag] = train_step({flag: True}, dropout, bf16)
        assert torch.equal(loss, loss_ck)
        assert grads.keys() == grads_ck.keys()
        for name in grads:
            assert torch.equal(grads[name], grads_ck[name]), (flag, name)
    assert saved_by["checkpoint_activations"] < saved / 5  # only the layers' inputs are kept (measured: 1/10)
    # offloaded, the layers' inputs are packed by save_on_cpu's hook, not counted on the device
    assert saved_by["offload_activations"] < saved_by["checkpoint_activations"]


def test_checkpoint_activations_keep_state_dict_and_generation():
    plain = build(share_all_embeddings=True, seed=4)
    flagged = build(share_all_embeddings=True, seed=4, checkpoint_activations=True)
    assert flagged.encoder.checkpoint_activations and flagged.decoder.checkpoint_activations
    assert plain.state_dict().keys() == flagged.state_dict().keys()
    plain.load_state_dict(flagged.state_dict(), strict=True)
    src = tokens(JOINED, [6, 4, 9], seed=8)
    sample = {"net_input": {"src_tokens": src, "src_lengths": src.ne(JOINED.pad()).sum(1)}}
    gen = SequenceGenerator([plain], JOINED, beam_size=4, max_len_b=10)
    with torch.no_grad():  # incremental decoding runs without checkpointing
        for a, b in zip(gen.generate([plain], sample), gen.generate([flagged], sample)):
            assert [h["tokens"].tolist() for h in a] == [h["tokens"].tolist() for h in b]


def test_converter_carries_checkpoint_activations_over():
    fairseq_model, args = builtin(JOINED, JOINED, share_all_embeddings=True, checkpoint_activations=True)
    new_args = convert_args(args)
    ours = VaswaniTransformerModel.build_model(copy.copy(new_args), task(JOINED, JOINED))
    ours.load_state_dict(convert_state_dict(fairseq_model.state_dict(), new_args), strict=True)
    assert ours.encoder.checkpoint_activations and ours.decoder.checkpoint_activations
