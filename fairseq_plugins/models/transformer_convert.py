"""Import a checkpoint of fairseq's built-in ``transformer`` into ``vaswani_transformer``.

The library behind ``fairseq-plugins-convert-transformer IN.pt OUT.pt [--force]``; this module
registers nothing (``models/__init__`` imports every module of the folder).

Works for every architecture of fairseq's ``transformer`` family, including the published
WMT models (``transformer_vaswani_wmt_en_de_big``, ``transformer_vaswani_wmt_en_fr_big``,
``transformer_wmt_en_de_big``, ``transformer_wmt_en_de_big_t2t``) and old checkpoints with
fused ``in_proj_weight`` attention. The output uses the same weights and the options that
make the same computation: ``--fairseq-positions`` (fairseq's sinusoid table), its
pre-/post-LN, learned positions, embedding sharing and dropouts. ``fairseq-generate`` and
``fairseq-interactive`` load it with ``--user-dir fairseq_plugins`` and the same data
directory. The optimizer state is dropped (its parameter layout changed): fine-tune from it
with ``--reset-optimizer``.

Options of fairseq's model that change the computation and have no counterpart here
(adaptive softmax, layernorm_embedding, unscaled embeddings, GELU, ...) are refused.
"""
import copy
from argparse import Namespace
from typing import Dict

import torch
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_NAME_REGISTRY
from omegaconf import OmegaConf

from fairseq_plugins.checkpoints import is_encoder_fast_path_copy, load_state
from fairseq_plugins.errors import CheckpointError
from fairseq_plugins.models.transformer import VaswaniTransformerModel

ARCH = "vaswani_transformer"

# fairseq option -> value under which vaswani_transformer computes the same thing
SAME_COMPUTATION = {
    "activation_fn": "relu",
    "adaptive_softmax_cutoff": None,
    "adaptive_input": False,
    "tie_adaptive_weights": False,
    "layernorm_embedding": False,
    "no_scale_embedding": False,
    "no_token_positional_embeddings": False,
    "cross_self_attention": False,
    "no_cross_attention": False,
    "merge_src_tgt_embed": False,
    "encoder_layers_to_keep": None,
    "decoder_layers_to_keep": None,
    "scale_attn": False,
    "scale_fc": False,
    "scale_heads": False,
    "scale_resids": False,
}

# old checkpoints numbered the layer norms of a layer
LAYER_NORM_NAMES = {
    "encoder": {"0": "self_attn_layer_norm", "1": "final_layer_norm"},
    "decoder": {"0": "self_attn_layer_norm", "1": "encoder_attn_layer_norm", "2": "final_layer_norm"},
}
DROPPED_SUFFIXES = (".version", "._float_tensor", "embed_positions.weights")


def _flat_model_options(model_cfg) -> Dict:
    """cfg.model of a checkpoint (Namespace, flat or nested DictConfig) -> flat dict."""
    options = (vars(model_cfg) if isinstance(model_cfg, Namespace)
               else OmegaConf.to_container(model_cfg, resolve=True))
    flat = {}
    for key, value in options.items():
        if key in ("encoder", "decoder") and isinstance(value, dict):  # TransformerConfig
            flat.update({f"{key}_{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return flat


def convert_args(model_cfg) -> Namespace:
    """Options of fairseq's transformer -> a complete Namespace for vaswani_transformer."""
    old = Namespace(**_flat_model_options(model_cfg))
    arch = getattr(old, "arch", None) or getattr(old, "_name", None)
    if ARCH_MODEL_NAME_REGISTRY.get(arch) != "transformer":
        raise CheckpointError(f"architecture {arch!r} is not of fairseq's 'transformer' family")
    if not hasattr(old, "activation_dropout") and hasattr(old, "relu_dropout"):
        old.activation_dropout = old.relu_dropout  # checkpoints before the rename
    ARCH_CONFIG_REGISTRY[arch](old)  # fill in what the architecture implied
    for option, value in SAME_COMPUTATION.items():
        if getattr(old, option, value) != value:
            raise CheckpointError(f"fairseq option {option}={getattr(old, option)!r} has no "
                                  f"counterpart in {ARCH} (needs {value!r})")
    d_dec = old.decoder_embed_dim
    if (getattr(old, "decoder_input_dim", d_dec), getattr(old, "decoder_output_dim", d_dec)) != (d_dec, d_dec):
        raise CheckpointError("fairseq options decoder_input_dim/decoder_output_dim differ from "
                              f"decoder_embed_dim {d_dec}: no counterpart in {ARCH}")
    new = copy.copy(old)  # the flags both models share keep their values
    new.arch = new._name = ARCH
    new.fairseq_positions = True
    new.alignment_layer = -1  # fairseq's default: the last decoder layer
    return new


def convert_state_dict(old: Dict[str, torch.Tensor], args: Namespace) -> Dict[str, torch.Tensor]:
    """Rename/fuse fairseq's parameters into vaswani_transformer's."""
    used = set()

    def take(key: str) -> torch.Tensor:
        if key not in old:
            raise CheckpointError(f"parameter {key} is missing from the checkpoint")
        used.add(key)
        return old[key]

    def qkv(prefix: str, part: str):
        """[W^Q, W^K, W^V] (or biases) of one attention, from either fairseq layout."""
        if f"{prefix}.in_proj_{part}" in old:  # before 2019: one fused matrix
            return list(take(f"{prefix}.in_proj_{part}").chunk(3))
        return [take(f"{prefix}.{p}_proj.{part}") for p in "qkv"]

    new = {}
    for side, num_layers in (("encoder", args.encoder_layers), ("decoder", args.decoder_layers)):
        for i in range(num_layers):
            layer = f"{side}.layers.{i}"
            attentions = ["self_attn"] + (["encoder_attn"] if side == "decoder" else [])
            for attn in attentions:
                for part in ("weight", "bias"):
                    q, k, v = qkv(f"{layer}.{attn}", part)
                    if attn == "self_attn":
                        new[f"{layer}.self_attn.in_proj.{part}"] = torch.cat([q, k, v])
                    else:
                        new[f"{layer}.encoder_attn.q_proj.{part}"] = q
                        new[f"{layer}.encoder_attn.kv_proj.{part}"] = torch.cat([k, v])
                    new[f"{layer}.{attn}.out_proj.{part}"] = take(f"{layer}.{attn}.out_proj.{part}")
            for number, name in LAYER_NORM_NAMES[side].items():
                for part in ("weight", "bias"):
                    numbered = f"{layer}.layer_norms.{number}.{part}"
                    new[f"{layer}.{name}.{part}"] = take(numbered if numbered in old else f"{layer}.{name}.{part}")
            for name in ("fc1", "fc2"):
                for part in ("weight", "bias"):
                    new[f"{layer}.{name}.{part}"] = take(f"{layer}.{name}.{part}")
        new[f"{side}.embed_tokens.weight"] = take(f"{side}.embed_tokens.weight")
        if getattr(args, f"{side}_learned_pos"):
            new[f"{side}.embed_positions.weight"] = take(f"{side}.embed_positions.weight")
        if getattr(args, f"{side}_normalize_before"):
            for part in ("weight", "bias"):
                new[f"{side}.layer_norm.{part}"] = take(f"{side}.layer_norm.{part}")
    if "decoder.output_projection.weight" in old:
        new["decoder.output_projection.weight"] = take("decoder.output_projection.weight")
    elif "decoder.embed_out" in old:  # before 2020
        new["decoder.output_projection.weight"] = take("decoder.embed_out")
    elif args.share_decoder_input_output_embed:
        new["decoder.output_projection.weight"] = new["decoder.embed_tokens.weight"]
    else:
        raise CheckpointError("the checkpoint has no output projection (decoder.output_projection)")
    dropped = {k for k in old if k.endswith(DROPPED_SUFFIXES) or is_encoder_fast_path_copy(k)}
    left = sorted(k for k in old if k not in used and k not in dropped)
    if left:
        raise CheckpointError(f"parameter {left[0]} (and {len(left) - 1} more) has no counterpart in {ARCH}")
    return new


def _placeholder_dictionary(size: int) -> Dictionary:
    d = Dictionary()
    for i in range(size - len(d)):
        d.add_symbol(f"<placeholder{i}>")
    return d


def check_loads(state_dict: Dict[str, torch.Tensor], args: Namespace):
    """Build the model at the converted options and load the weights strictly."""
    src = _placeholder_dictionary(state_dict["encoder.embed_tokens.weight"].size(0))
    tgt = src if args.share_all_embeddings else _placeholder_dictionary(
        state_dict["decoder.embed_tokens.weight"].size(0))
    task = Namespace(source_dictionary=src, target_dictionary=tgt)
    model = VaswaniTransformerModel.build_model(copy.copy(args), task)
    model.load_state_dict(state_dict, strict=True)


def convert_checkpoint(path: str) -> Dict:
    """Read a fairseq transformer checkpoint and return the vaswani_transformer one."""
    state = load_state(path)  # CheckpointError naming the file if it is not one
    cfg = state.get("cfg")
    if cfg is None or cfg.get("model") is None:
        raise CheckpointError(f"{path}: not a fairseq model checkpoint (no cfg.model)")
    try:
        args = convert_args(cfg.model)
        model_state = convert_state_dict(state["model"], args)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None
    check_loads(model_state, args)
    cfg_out = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    cfg_out["model"] = args
    state.update(model=model_state, cfg=cfg_out, args=None)
    state.pop("last_optimizer_state", None)
    return state
