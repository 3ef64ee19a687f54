"""The Transformer of Vaswani et al., "Attention Is All You Need" (NIPS 2017).

Registered as fairseq model ``vaswani_transformer`` with architectures
``vaswani_transformer_base`` (N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1; also plain
``vaswani_transformer``), ``vaswani_transformer_big`` (N=6, 1024, 4096, 16, 0.3) and
``vaswani_transformer_tiny`` (2+2 layers, 64, 256, 4, for CPU tests and the quickstart).
Size and regularisation flags are those of fairseq's built-in ``transformer``, so its
command lines carry over.

Defaults follow the paper: post-LN sub-layers, embeddings scaled by √d_model, sinusoidal
encodings with sines on even and cosines on odd dimensions, dropout on the sum of
embeddings and encodings, ReLU FFN, no attention/ReLU dropout. ``--fairseq-positions``,
``--*-normalize-before``, ``--*-learned-pos``, ``--attention-dropout`` and
``--activation-dropout`` give later practice (and what converted fairseq checkpoints need).
``--checkpoint-activations`` (fairseq's flag) recomputes each layer in the backward pass instead
of keeping its activations: less memory for long batches, same results.

Tensors are batch-first, [B, T, d_model]. The encoder output dict holds ``encoder_out``
[B, S, d] and ``encoder_padding_mask`` [B, S] (True on padding; empty list when the batch
has none). In eval mode the decoder returns the encoder–decoder attention of layer
``--alignment-layer`` averaged over heads, ``extra["attn"] = [[B, T, S]]``, which
``fairseq-generate --print-alignment`` prints (fairseq-generate turns it off otherwise).
"""
import logging
import math
from contextlib import nullcontext
from typing import Optional

import torch
import torch.utils.checkpoint
from fairseq.models import (
    FairseqEncoder,
    register_model,
    register_model_architecture,
)
from fairseq.modules import FairseqDropout
from torch import Tensor, nn

from fairseq_plugins.errors import ConfigError
from fairseq_plugins.models._decoding import SuiteModel
from fairseq_plugins.modules.beam_cache import (
    BeamCache,
    BeamCacheDecoder,
    EncoderOut,
    IncrementalState,
    reorder_encoder_out,
)
from fairseq_plugins.modules.positional_embedding import build_positional_encoding
from fairseq_plugins.modules.transformer_layer import (
    FFN_INITS,
    TransformerDecoderLayer,
    TransformerEncoderLayer,
)

DEFAULT_MAX_POSITIONS = 1024
logger = logging.getLogger("fairseq_plugins.models")


def Embedding(num_embeddings: int, embedding_dim: int, padding_idx: int) -> nn.Embedding:
    m = nn.Embedding(num_embeddings, embedding_dim, padding_idx=padding_idx)
    nn.init.normal_(m.weight, mean=0, std=embedding_dim**-0.5)
    nn.init.zeros_(m.weight[padding_idx])
    return m


def run_layer(layer: nn.Module, args: tuple, checkpoint: bool, offload: bool):
    """``layer(*args)``; with ``checkpoint``, in training, only the layer's inputs are kept for the
    backward pass (in CPU memory with ``offload``) and its activations are recomputed there.

    torch's non-reentrant checkpoint, not fairseq's ``checkpoint_wrapper``: fairseq's recomputes
    outside the forward's autocast, so with ``--autocast-bf16`` the gradients would be those of
    an fp32 forward; torch's restores autocast and the RNG (same dropout masks) and keeps the
    autograd graph, so the gradients are the same. Nothing wraps the modules: the state dict
    keys do not change.
    """
    if not (checkpoint and layer.training and torch.is_grad_enabled()):
        return layer(*args)  # evaluation and incremental decoding keep nothing anyway
    with torch.autograd.graph.save_on_cpu(pin_memory=args[0].is_cuda) if offload else nullcontext():
        return torch.utils.checkpoint.checkpoint(layer, *args, use_reentrant=False)


def init_layer_stack(stack: nn.Module, args, side: str, embed_tokens: nn.Embedding, make_layer) -> None:
    """What the encoder and the decoder (``side``) share: √d_model-scaled embeddings plus
    positions, ``--{side}-layers`` layers from ``make_layer(d_model, index)``, and the final LayerNorm
    of pre-LN stacks."""
    d_model = embed_tokens.embedding_dim
    positions = "source" if side == "encoder" else "target"
    stack.padding_idx = stack.dictionary.pad()
    # fairseq's module, so that --retain-dropout(-modules) can keep it on in generation
    stack.dropout_module = FairseqDropout(args.dropout, module_name=stack.__class__.__name__)
    stack.embed_tokens = embed_tokens
    stack.embed_scale = math.sqrt(d_model)  # √d_model
    stack.embed_positions = build_positional_encoding(
        getattr(args, f"max_{positions}_positions"), d_model, stack.padding_idx, getattr(args, f"{side}_learned_pos"),
        args.fairseq_positions, f"--max-{positions}-positions")
    stack.layers = nn.ModuleList(make_layer(d_model, i) for i in range(getattr(args, f"{side}_layers")))
    stack.layer_norm = nn.LayerNorm(d_model) if getattr(args, f"{side}_normalize_before") else None
    stack.checkpoint_activations, stack.offload_activations = args.checkpoint_activations, args.offload_activations


class VaswaniTransformerEncoder(FairseqEncoder):
    """N × (self-attention, FFN) over √d_model·E x + PE (§3.1, §3.4, §3.5)."""

    def __init__(self, args, dictionary, embed_tokens: nn.Embedding):
        super().__init__(dictionary)
        init_layer_stack(self, args, "encoder", embed_tokens, lambda d_model, _: TransformerEncoderLayer(
            d_model, args.encoder_ffn_embed_dim, args.encoder_attention_heads, args.dropout, args.attention_dropout,
            args.activation_dropout, args.encoder_normalize_before, ffn_init=args.ffn_init))

    def forward(self, src_tokens: Tensor, src_lengths: Optional[Tensor] = None) -> EncoderOut:
        """src_tokens: [B, S], left-padded."""
        padding_mask = src_tokens.eq(self.padding_idx)  # [B, S]
        attn_mask = ~padding_mask[:, None, None, :]  # [B, 1, 1, S]
        x = self.embed_scale * self.embed_tokens(src_tokens) + self.embed_positions(src_tokens)  # √d·E x + PE
        x = self.dropout_module(x)
        for layer in self.layers:
            x = run_layer(layer, (x, attn_mask), self.checkpoint_activations, self.offload_activations)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        return {"encoder_out": [x], "encoder_padding_mask": [padding_mask]}

    def reorder_encoder_out(self, encoder_out: EncoderOut, new_order: Tensor) -> EncoderOut:
        return reorder_encoder_out(encoder_out, new_order)

    def max_positions(self) -> int:
        return self.embed_positions.max_positions


class VaswaniTransformerDecoder(BeamCacheDecoder):
    """N × (masked self-attention, encoder–decoder attention, FFN), then the pre-softmax
    projection (§3.1, §3.4)."""

    def __init__(self, args, dictionary, embed_tokens: nn.Embedding, encoder_dim: int):
        super().__init__(dictionary)
        d_model = embed_tokens.embedding_dim
        init_layer_stack(self, args, "decoder", embed_tokens, lambda d_model, i: TransformerDecoderLayer(
            d_model, args.decoder_ffn_embed_dim, args.decoder_attention_heads, args.dropout, args.attention_dropout,
            args.activation_dropout, args.decoder_normalize_before, encoder_dim, ffn_init=args.ffn_init, layer=i))
        self.alignment_layer = args.alignment_layer % args.decoder_layers
        self.need_attn = True  # fairseq-generate sets it to --print-alignment
        self.output_projection = nn.Linear(d_model, len(dictionary), bias=False)
        if args.share_decoder_input_output_embed:
            self.output_projection.weight = embed_tokens.weight  # §3.4: shared with the embedding
        else:
            nn.init.normal_(self.output_projection.weight, mean=0, std=d_model**-0.5)

    def forward(self, prev_output_tokens: Tensor, encoder_out: EncoderOut,
                incremental_state: Optional[IncrementalState] = None, features_only: bool = False,
                **unused):
        """prev_output_tokens: [B, T] -> logits [B, T, V] (T = 1 with incremental_state)."""
        x, extra = self.extract_features(prev_output_tokens, encoder_out, incremental_state)
        if not features_only:
            x = self.output_layer(x)
        return x, extra

    def extract_features(self, prev_output_tokens: Tensor, encoder_out: Optional[EncoderOut],
                         incremental_state: Optional[IncrementalState] = None, **unused):
        cache = None if incremental_state is None else self.decoding_cache(incremental_state, encoder_out)
        positions = self.embed_positions(prev_output_tokens, cache is not None)  # [B, T or 1, d]
        if cache is not None:
            prev_output_tokens = prev_output_tokens[:, -1:]  # the newest token only
            cache.begin_step()
            encoder, padding = None, cache.per_beam["encoder_padding_mask"]  # [R, S]
        else:
            encoder, padding = encoder_out["encoder_out"][0], encoder_out["encoder_padding_mask"][0]
        x = self.embed_scale * self.embed_tokens(prev_output_tokens) + positions  # √d·E y + PE
        x = self.dropout_module(x)
        encoder_attn_mask = ~padding[:, None, None, :]  # [R, 1, 1, S]
        need_attn = self.need_attn and not self.training
        attn: Optional[Tensor] = None
        for idx, layer in enumerate(self.layers):
            x, layer_attn = run_layer(layer, (x, encoder, encoder_attn_mask, cache,
                                              need_attn and idx == self.alignment_layer),
                                      self.checkpoint_activations, self.offload_activations)
            if layer_attn is not None:
                attn = layer_attn
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        return x, {"attn": [attn]}

    def start_cache(self, encoder_out: EncoderOut, cache: BeamCache) -> None:
        """Per sentence: every layer's encoder keys and values [R, h, S, d_k] and the source
        padding mask [R, S]; room for every layer's self-attention keys and values."""
        beams = cache.beam_rows(encoder_out)
        encoder = beams["encoder_out"][0]  # [R, S, d]
        for layer in self.layers:
            layer.encoder_attn.start_cache(cache, encoder)
        for layer in self.layers:
            layer.self_attn.start_cache(cache, encoder)
        cache.per_beam["encoder_padding_mask"] = beams["encoder_padding_mask"][0]

    def output_layer(self, features: Tensor) -> Tensor:
        return self.output_projection(features)  # pre-softmax linear transformation

    def max_positions(self) -> int:
        return self.embed_positions.max_positions

    def make_generation_fast_(self, need_attn: bool = False, **kwargs):
        self.need_attn = need_attn


@register_model("vaswani_transformer")
class VaswaniTransformerModel(SuiteModel):
    """Encoder–decoder Transformer, exact to Vaswani et al. (2017) by default."""

    @staticmethod
    def add_args(parser):
        # fmt: off
        parser.add_argument("--dropout", type=float, metavar="D",
                            help="P_drop: dropout on sub-layer outputs and on embeddings + encodings")
        parser.add_argument("--attention-dropout", type=float, metavar="D",
                            help="dropout on attention weights (not in the paper; default 0)")
        parser.add_argument("--activation-dropout", "--relu-dropout", type=float, metavar="D",
                            help="dropout after the FFN's ReLU (not in the paper; default 0)")
        for side in ("encoder", "decoder"):
            parser.add_argument(f"--{side}-layers", type=int, metavar="N",
                                help=f"N: number of {side} layers")
            parser.add_argument(f"--{side}-embed-dim", type=int, metavar="D",
                                help=f"d_model of the {side} (embedding dimension)")
            parser.add_argument(f"--{side}-ffn-embed-dim", type=int, metavar="D",
                                help=f"d_ff: inner dimension of the {side} FFN")
            parser.add_argument(f"--{side}-attention-heads", type=int, metavar="H",
                                help=f"h: attention heads of the {side} (must divide d_model)")
            parser.add_argument(f"--{side}-normalize-before", action="store_true",
                                help=f"pre-LN {side}: x + Dropout(Sublayer(LayerNorm(x))) and a "
                                     "final LayerNorm, instead of the paper's post-LN")
            parser.add_argument(f"--{side}-learned-pos", action="store_true",
                                help=f"learned {side} positional embeddings instead of sinusoids")
        parser.add_argument("--share-decoder-input-output-embed", action="store_true",
                            help="tie the target embedding and the pre-softmax projection")
        parser.add_argument("--share-all-embeddings", action="store_true",
                            help="one matrix for source embedding, target embedding and pre-softmax "
                                 "projection (§3.4); needs fairseq-preprocess --joined-dictionary")
        parser.add_argument("--fairseq-positions", action="store_true",
                            help="fairseq's sinusoid table (sines then cosines, tensor2tensor's "
                                 "frequencies, first position padding_idx+1) instead of the paper's; "
                                 "set by fairseq-plugins-convert-transformer")
        parser.add_argument("--ffn-init", choices=FFN_INITS,
                            help="initialisation of the FFN's W_1, W_2 (the paper is silent): linear = "
                                 "nn.Linear's U(±1/sqrt(fan_in)) weights and biases, as fairseq's transformer "
                                 "(default); xavier = Xavier-uniform weights, zero biases")
        parser.add_argument("--alignment-layer", type=int, metavar="L",
                            help="decoder layer (0-based, negative counts from the top; default -1) "
                                 "whose encoder-decoder attention is returned as the alignment")
        parser.add_argument("--checkpoint-activations", action="store_true",
                            help="activation checkpointing: keep only each layer's input for the backward "
                                 "pass and recompute the layer there; less memory for long batches, about "
                                 "one more forward of compute, same results (training only)")
        parser.add_argument("--offload-activations", action="store_true",
                            help="--checkpoint-activations with the kept layer inputs moved to CPU memory "
                                 "(for GPUs); implies --checkpoint-activations")
        # fmt: on

    @classmethod
    def build_model(cls, args, task):
        vaswani_transformer_base(args)  # fill in what the architecture left unset
        encoder, decoder = ((getattr(args, f"{side}_layers"), getattr(args, f"{side}_attention_heads"))
                            for side in ("encoder", "decoder"))
        if encoder != decoder:  # a user who set only --encoder-* may expect N and h on both sides
            logger.info(f"{args.arch}: encoder {encoder[0]} layers, {encoder[1]} heads; decoder {decoder[0]} layers, "
                        f"{decoder[1]} heads (--decoder-layers/--decoder-attention-heads do not follow "
                        "--encoder-*, as in fairseq's transformer)")
        if args.offload_activations:
            args.checkpoint_activations = True  # offloading implies checkpointing, as in fairseq
        for side in ("encoder", "decoder"):
            d_model, heads = getattr(args, f"{side}_embed_dim"), getattr(args, f"{side}_attention_heads")
            if d_model % heads != 0:
                raise ConfigError(f"--{side}-embed-dim {d_model} is not divisible by "
                                 f"--{side}-attention-heads {heads}")
        if not -args.decoder_layers <= args.alignment_layer < args.decoder_layers:
            raise ConfigError(f"--alignment-layer {args.alignment_layer} is outside the "
                             f"{args.decoder_layers} decoder layers")
        src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
        if args.share_all_embeddings:
            if src_dict != tgt_dict:
                raise ConfigError("--share-all-embeddings needs a joined dictionary (fairseq-preprocess "
                                 "--joined-dictionary), but dict.src and dict.tgt differ")
            if args.encoder_embed_dim != args.decoder_embed_dim:
                raise ConfigError(f"--share-all-embeddings needs --encoder-embed-dim "
                                 f"({args.encoder_embed_dim}) == --decoder-embed-dim "
                                 f"({args.decoder_embed_dim})")
            args.share_decoder_input_output_embed = True
            encoder_embed = decoder_embed = Embedding(len(src_dict), args.encoder_embed_dim, src_dict.pad())
        else:
            encoder_embed = Embedding(len(src_dict), args.encoder_embed_dim, src_dict.pad())
            decoder_embed = Embedding(len(tgt_dict), args.decoder_embed_dim, tgt_dict.pad())
        encoder = VaswaniTransformerEncoder(args, src_dict, encoder_embed)
        decoder = VaswaniTransformerDecoder(args, tgt_dict, decoder_embed, args.encoder_embed_dim)
        return cls(encoder, decoder)


@register_model_architecture("vaswani_transformer", "vaswani_transformer")
def vaswani_transformer_base(args):
    """Transformer (base model), Table 3: N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1."""
    args.encoder_layers = getattr(args, "encoder_layers", 6)
    args.encoder_embed_dim = getattr(args, "encoder_embed_dim", 512)
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", 2048)
    args.encoder_attention_heads = getattr(args, "encoder_attention_heads", 8)
    # fairseq's rule, so its command lines build the same model: the decoder's widths follow the
    # encoder's, its depth and heads do not (build_model names the difference in one line)
    args.decoder_layers = getattr(args, "decoder_layers", 6)
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", args.encoder_embed_dim)
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", args.encoder_ffn_embed_dim)
    args.decoder_attention_heads = getattr(args, "decoder_attention_heads", 8)
    args.dropout = getattr(args, "dropout", 0.1)
    args.attention_dropout = getattr(args, "attention_dropout", 0.0)
    args.activation_dropout = getattr(args, "activation_dropout", 0.0)
    args.encoder_normalize_before = getattr(args, "encoder_normalize_before", False)
    args.decoder_normalize_before = getattr(args, "decoder_normalize_before", False)
    args.encoder_learned_pos = getattr(args, "encoder_learned_pos", False)
    args.decoder_learned_pos = getattr(args, "decoder_learned_pos", False)
    args.share_decoder_input_output_embed = getattr(args, "share_decoder_input_output_embed", False)
    args.share_all_embeddings = getattr(args, "share_all_embeddings", False)
    args.fairseq_positions = getattr(args, "fairseq_positions", False)
    args.ffn_init = getattr(args, "ffn_init", "linear")
    args.alignment_layer = getattr(args, "alignment_layer", -1)
    args.max_source_positions = getattr(args, "max_source_positions", DEFAULT_MAX_POSITIONS)
    args.max_target_positions = getattr(args, "max_target_positions", DEFAULT_MAX_POSITIONS)
    args.checkpoint_activations = getattr(args, "checkpoint_activations", False)
    args.offload_activations = getattr(args, "offload_activations", False)


register_model_architecture("vaswani_transformer", "vaswani_transformer_base")(vaswani_transformer_base)


@register_model_architecture("vaswani_transformer", "vaswani_transformer_big")
def vaswani_transformer_big(args):
    """Transformer (big), Table 3: N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.3
    (the paper used 0.1 for En-Fr: pass --dropout 0.1)."""
    args.encoder_embed_dim = getattr(args, "encoder_embed_dim", 1024)
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", 4096)
    args.encoder_attention_heads = getattr(args, "encoder_attention_heads", 16)
    args.decoder_attention_heads = getattr(args, "decoder_attention_heads", 16)
    args.dropout = getattr(args, "dropout", 0.3)
    vaswani_transformer_base(args)


@register_model_architecture("vaswani_transformer", "vaswani_transformer_tiny")
def vaswani_transformer_tiny(args):
    """2+2 layers, d_model=64, d_ff=256, h=4: CPU tests and the quickstart."""
    args.encoder_layers = getattr(args, "encoder_layers", 2)
    args.encoder_embed_dim = getattr(args, "encoder_embed_dim", 64)
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", 256)
    args.encoder_attention_heads = getattr(args, "encoder_attention_heads", 4)
    args.decoder_layers = getattr(args, "decoder_layers", 2)
    args.decoder_attention_heads = getattr(args, "decoder_attention_heads", 4)
    vaswani_transformer_base(args)
