"""``vaswani_transformer`` as a maintained transformers class, weight for weight.

* The paper's layout (post-LN, √d_model scale, the paper's sinusoids from position 0, no final
  LayerNorm) is :class:`~transformers.MarianMTModel`. Marian's sinusoid table holds the sines in
  the first half of the model dimension and the cosines in the second, ours interleaves them
  (sine on 2i, cosine on 2i+1). A Transformer is invariant under one permutation of the model
  dimension applied to every weight that reads or writes it (embeddings, the inputs of the
  Q/K/V projections, FFN and output projection, the outputs of W^O and W_2 with their biases,
  LayerNorm gains and biases: its mean and variance do not depend on the order), so Marian
  dimension k holds our dimension ``PERM[k] = (0, 2, 4, ..., 1, 3, 5, ...)[k]``: exact.
* ``--fairseq-positions`` (fairseq's own table, converted built-in checkpoints) is
  :class:`~transformers.FSMTForConditionalGeneration`, fairseq's layout: no permutation.

Anything else neither class computes is refused, naming the flag, before anything is written.
Every tensor goes through ``load_state_dict(strict=True)`` into the transformers model, so a
weight left out or misnamed here fails the export.
"""
import torch

from fairseq_plugins.errors import ConfigError
from fairseq_plugins.export.common import check_one_width

MARIAN, FSMT = "marian", "fsmt"


def layout(model) -> str:
    """``"marian"`` or ``"fsmt"``: the transformers class that computes ``model`` exactly."""
    encoder, decoder = model.encoder, model.decoder
    d_enc, d_dec = encoder.embed_tokens.embedding_dim, decoder.embed_tokens.embedding_dim
    check_one_width(d_enc, d_dec, "MarianMT and FSMT have one d_model")
    for side, stack in (("encoder", encoder), ("decoder", decoder)):
        if stack.layer_norm is not None:
            raise ConfigError(f"--{side}-normalize-before (pre-LN): not exported to transformers "
                              "(MarianMT and FSMT are post-LN); CTranslate2 and torch.export take it")
        if isinstance(stack.embed_positions.weight, torch.nn.Parameter):
            raise ConfigError(f"--{side}-learned-pos: not exported to transformers (MarianMT and FSMT "
                              "compute sinusoids); CTranslate2 and torch.export take it")
    if _fairseq_positions(model):
        return FSMT
    if d_enc % 2:
        raise ConfigError(f"--encoder-embed-dim {d_enc} is odd: the sinusoid table needs an even d_model")
    return MARIAN


def _fairseq_positions(model) -> bool:
    """Whether the position table is fairseq's (``--fairseq-positions``) rather than the paper's."""
    from fairseq.modules import SinusoidalPositionalEmbedding

    positions = model.encoder.embed_positions
    table = SinusoidalPositionalEmbedding.get_embedding(positions.weight.size(0), positions.weight.size(1),
                                                        positions.padding_idx)
    return torch.equal(table, positions.weight)


def check_supported(model) -> None:
    layout(model)


def permutation(d_model: int) -> torch.Tensor:
    """[d_model]: Marian's dimension k holds ours ``perm[k]`` (sines first, then cosines)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


class _Mapper:
    """Our tensors in the transformers model's dimension order (``perm`` of the model dimension)."""

    def __init__(self, perm):
        self.perm = perm

    def reads(self, weight):  # a Linear or embedding whose input (columns) is the model dimension
        return weight[:, self.perm]

    def writes(self, tensor):  # the output rows (or a bias / LayerNorm vector) in the model dimension
        return tensor[self.perm]


def _attention(out, prefix, attn, m: _Mapper, self_attention: bool):
    d = attn.embed_dim
    if self_attention:
        q_w, k_w, v_w = attn.in_proj.weight.split(d)  # [W^Q; W^K; W^V]: [3d, d]
        q_b, k_b, v_b = attn.in_proj.bias.split(d)
    else:
        q_w, q_b = attn.q_proj.weight, attn.q_proj.bias
        k_w, v_w = attn.kv_proj.weight.split(d)  # [W^K; W^V]: [2d, d]
        k_b, v_b = attn.kv_proj.bias.split(d)
    for name, w, b in (("q", q_w, q_b), ("k", k_w, k_b), ("v", v_w, v_b)):
        out[f"{prefix}.{name}_proj.weight"], out[f"{prefix}.{name}_proj.bias"] = m.reads(w), b
    out[f"{prefix}.out_proj.weight"] = m.writes(attn.out_proj.weight)
    out[f"{prefix}.out_proj.bias"] = m.writes(attn.out_proj.bias)


def _norm(out, prefix, norm, m: _Mapper):
    out[f"{prefix}.weight"], out[f"{prefix}.bias"] = m.writes(norm.weight), m.writes(norm.bias)


def _layer(out, prefix, layer, m: _Mapper, decoder: bool):
    _attention(out, f"{prefix}.self_attn", layer.self_attn, m, True)
    _norm(out, f"{prefix}.self_attn_layer_norm", layer.self_attn_layer_norm, m)
    if decoder:
        _attention(out, f"{prefix}.encoder_attn", layer.encoder_attn, m, False)
        _norm(out, f"{prefix}.encoder_attn_layer_norm", layer.encoder_attn_layer_norm, m)
    out[f"{prefix}.fc1.weight"], out[f"{prefix}.fc1.bias"] = m.reads(layer.fc1.weight), layer.fc1.bias  # W_1
    out[f"{prefix}.fc2.weight"], out[f"{prefix}.fc2.bias"] = m.writes(layer.fc2.weight), m.writes(layer.fc2.bias)
    _norm(out, f"{prefix}.final_layer_norm", layer.final_layer_norm, m)


def _config_args(model):
    encoder, decoder = model.encoder, model.decoder
    first_enc, first_dec = encoder.layers[0], decoder.layers[0]
    return dict(
        d_model=encoder.embed_tokens.embedding_dim,
        encoder_layers=len(encoder.layers), decoder_layers=len(decoder.layers),
        encoder_attention_heads=first_enc.self_attn.num_heads, decoder_attention_heads=first_dec.self_attn.num_heads,
        encoder_ffn_dim=first_enc.fc1.out_features, decoder_ffn_dim=first_dec.fc1.out_features,
        activation_function="relu", scale_embedding=True,
        dropout=first_enc.dropout_module.p, attention_dropout=first_enc.self_attn.dropout_module.p,
        activation_dropout=first_enc.activation_dropout_module.p,
        max_position_embeddings=max(encoder.max_positions(), decoder.max_positions()),
        pad_token_id=decoder.dictionary.pad(), eos_token_id=decoder.dictionary.eos(),
        bos_token_id=decoder.dictionary.bos(), decoder_start_token_id=decoder.dictionary.eos(),
        forced_eos_token_id=None, is_encoder_decoder=True,
    )


def build(model):
    """The transformers model computing ``model`` (eval mode), its weights loaded strictly."""
    kind = layout(model)
    encoder, decoder = model.encoder, model.decoder
    tied_output = decoder.output_projection.weight is decoder.embed_tokens.weight
    shared_all = encoder.embed_tokens.weight is decoder.embed_tokens.weight
    d_model = encoder.embed_tokens.embedding_dim
    if kind == MARIAN:
        from transformers import MarianConfig, MarianMTModel

        config = MarianConfig(vocab_size=len(encoder.dictionary), decoder_vocab_size=len(decoder.dictionary),
                              share_encoder_decoder_embeddings=shared_all, tie_word_embeddings=tied_output,
                              **_config_args(model))
        hf, m = MarianMTModel(config), _Mapper(permutation(d_model))
        output_key = "lm_head.weight"
    else:
        from transformers import FSMTConfig, FSMTForConditionalGeneration

        # FSMT ties all three matrices or none: --share-decoder-input-output-embed alone is written
        # as two equal copies
        config = FSMTConfig(langs=["src", "tgt"], src_vocab_size=len(encoder.dictionary),
                            tgt_vocab_size=len(decoder.dictionary), tie_word_embeddings=shared_all,
                            **_config_args(model))
        hf, m = FSMTForConditionalGeneration(config), _Mapper(torch.arange(d_model))
        output_key = "model.decoder.output_projection.weight"
    out = {}
    with torch.no_grad():
        out["model.encoder.embed_tokens.weight"] = m.reads(encoder.embed_tokens.weight)
        out["model.decoder.embed_tokens.weight"] = m.reads(decoder.embed_tokens.weight)
        out[output_key] = m.reads(decoder.output_projection.weight)
        for i, layer in enumerate(encoder.layers):
            _layer(out, f"model.encoder.layers.{i}", layer, m, decoder=False)
        for i, layer in enumerate(decoder.layers):
            _layer(out, f"model.decoder.layers.{i}", layer, m, decoder=True)
        own = hf.state_dict()
        if "model.shared.weight" in own:
            out["model.shared.weight"] = out["model.encoder.embed_tokens.weight"]
        if "final_logits_bias" in own:
            out["final_logits_bias"] = torch.zeros_like(own["final_logits_bias"])  # no bias in the paper
        for side, stack in (("encoder", encoder), ("decoder", decoder)):
            key = f"model.{side}.embed_positions.weight"
            # the table transformers computes is ours in its dimension order: Marian's row p is our
            # row padding_idx + 1 + p, FSMT numbers rows as fairseq does
            ours, theirs = stack.embed_positions.weight, own[key]
            expected = m.reads(ours[:theirs.size(0)] if kind == FSMT else ours[stack.padding_idx + 1:])
            if not torch.allclose(theirs[:expected.size(0)], expected[:theirs.size(0)], atol=1e-6):
                raise ConfigError(f"{side} position table differs from {type(hf).__name__}'s: not exported")
            out[key] = theirs
        hf.load_state_dict({k: v.detach().clone().contiguous() for k, v in out.items()}, strict=True)
    decoder_in = hf.get_decoder().embed_tokens.weight
    if kind == MARIAN and tied_output and hf.lm_head.weight.data_ptr() != decoder_in.data_ptr():
        raise ConfigError("the tied output projection would not stay tied in MarianMT: not exported")
    return hf.eval()


def write_model(model, out_dir: str) -> None:
    build(model).save_pretrained(out_dir)
