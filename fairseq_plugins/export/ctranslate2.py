"""Write a ``vaswani_transformer`` checkpoint as a CTranslate2 model.

    fairseq-plugins-export-ctranslate2 CHECKPOINT OUT_DIR [--quantization int8] [--force]

The model is described with CTranslate2's own specification classes
(``ctranslate2.specs.transformer_spec``) and written by its ``Converter`` (validation,
quantization, ``model.bin``, ``config.json``, vocabularies). What is read from the checkpoint:

* the position table as a weight, whatever its kind (the paper's sinusoids, fairseq's table
  under ``--fairseq-positions``, learned): CTranslate2 adds row p to the p-th token, which is
  our row ``padding_idx + 1 + p``;
* the embedding scale √d_model (``embed_scale`` of each side);
* post-LN (the paper; no final LayerNorm) or pre-LN (a final LayerNorm) per side;
* shared or separate embeddings and the output projection;
* the alignment layer; its heads are averaged, as ``--print-alignment`` does.

The vocabularies are the fairseq dictionaries in their order, special symbols included
(``<pad>`` written as ``<blank>``, as CTranslate2's fairseq converter does); the source gets
``</s>`` appended and decoding starts from ``</s>``, as in fairseq.
"""
from typing import Optional

from fairseq_plugins.errors import ConfigError
from fairseq_plugins.export.common import (build_model, check_one_width, check_output, model_family, model_options,
                                           read_checkpoint, staged_folder)

MODEL = "vaswani_transformer"
QUANTIZATIONS = ("int8", "int8_float32", "int16", "float16", "bfloat16")
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which the model uses


def check_exportable(state: dict, checkpoint: str) -> None:
    """Refuse, in one line, a checkpoint (``state``, read from ``checkpoint``) CTranslate2 cannot express."""
    options = model_options(state, checkpoint)
    model_family(options, checkpoint, [MODEL], "CTranslate2")
    check_one_width(options.encoder_embed_dim, options.decoder_embed_dim,
                    "CTranslate2's encoder-decoder attention is not tested with two widths")


def load_model(checkpoint: str, data: Optional[str] = None):
    """The model in eval mode and its task (dictionaries), read as fairseq-generate does."""
    state = read_checkpoint(checkpoint)
    check_exportable(state, checkpoint)
    return build_model(state, checkpoint, data)


def _linear(spec, module):
    spec.weight = module.weight.detach().numpy()
    if module.bias is not None:
        spec.bias = module.bias.detach().numpy()


def _norm(spec, module):
    spec.gamma = module.weight.detach().numpy()
    spec.beta = module.bias.detach().numpy()


def _inputs(spec, side):
    """Token embeddings, their √d_model scale and the position table of one side."""
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = side.embed_tokens.weight.detach().numpy()
    spec.scale_embeddings = side.embed_scale  # √d_model
    positions = side.embed_positions
    spec.position_encodings.encodings = positions.weight.detach()[positions.padding_idx + 1:].numpy()
    if side.layer_norm is not None:  # pre-LN: the final LayerNorm of the stack
        _norm(spec.layer_norm, side.layer_norm)


def _ffn(spec, layer):
    _norm(spec.layer_norm, layer.final_layer_norm)
    _linear(spec.linear_0, layer.fc1)  # W_1, b_1
    _linear(spec.linear_1, layer.fc2)  # W_2, b_2


def build_spec(model):
    """CTranslate2's ``TransformerSpec`` holding the weights of ``model``."""
    from ctranslate2.specs import transformer_spec

    encoder, decoder = model.encoder, model.decoder
    enc_layers, dec_layers = encoder.layers, decoder.layers
    enc_spec = transformer_spec.TransformerEncoderSpec(
        len(enc_layers), enc_layers[0].self_attn.num_heads, pre_norm=encoder.layer_norm is not None)
    dec_spec = transformer_spec.TransformerDecoderSpec(
        len(dec_layers), dec_layers[0].self_attn.num_heads, pre_norm=decoder.layer_norm is not None,
        alignment_layer=decoder.alignment_layer, alignment_heads=0)  # 0: average of all heads
    _inputs(enc_spec, encoder)
    _inputs(dec_spec, decoder)
    for spec, layer in zip(enc_spec.layer, enc_layers):
        _linear(spec.self_attention.linear[0], layer.self_attn.in_proj)  # [W^Q; W^K; W^V]
        _linear(spec.self_attention.linear[1], layer.self_attn.out_proj)  # W^O
        _norm(spec.self_attention.layer_norm, layer.self_attn_layer_norm)
        _ffn(spec.ffn, layer)
    for spec, layer in zip(dec_spec.layer, dec_layers):
        _linear(spec.self_attention.linear[0], layer.self_attn.in_proj)
        _linear(spec.self_attention.linear[1], layer.self_attn.out_proj)
        _norm(spec.self_attention.layer_norm, layer.self_attn_layer_norm)
        _linear(spec.attention.linear[0], layer.encoder_attn.q_proj)  # W^Q
        _linear(spec.attention.linear[1], layer.encoder_attn.kv_proj)  # [W^K; W^V]
        _linear(spec.attention.linear[2], layer.encoder_attn.out_proj)
        _norm(spec.attention.layer_norm, layer.encoder_attn_layer_norm)
        _ffn(spec.ffn, layer)
    _linear(dec_spec.projection, decoder.output_projection)  # pre-softmax linear transformation
    spec = transformer_spec.TransformerSpec(enc_spec, dec_spec)
    spec.config.layer_norm_epsilon = LAYER_NORM_EPS
    spec.config.decoder_start_token = spec.config.eos_token  # fairseq starts decoding from </s>
    spec.config.add_source_eos = True  # fairseq's sources end with </s>
    return spec


def vocabulary(dictionary):
    """fairseq's symbols in index order; ``<pad>`` is CTranslate2's ``<blank>``."""
    return ["<blank>" if symbol == "<pad>" else symbol for symbol in dictionary.symbols]


def export(checkpoint: str, out_dir: str, quantization: Optional[str] = None, force: bool = False,
           data: Optional[str] = None) -> str:
    """Write ``out_dir``; every refusal comes before anything is written."""
    from ctranslate2.converters.converter import Converter

    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ConfigError(f"--quantization {quantization} is not one of {', '.join(QUANTIZATIONS)}")
    check_output(out_dir, force, "model.bin", "CTranslate2 model directory")
    model, task = load_model(checkpoint, data)
    spec = build_spec(model)
    spec.register_source_vocabulary(vocabulary(task.source_dictionary))
    spec.register_target_vocabulary(vocabulary(task.target_dictionary))

    class _Converter(Converter):
        def _load(self):
            return spec

    with staged_folder(out_dir) as staging:
        _Converter().convert(staging, quantization=quantization, force=True)
    return out_dir
