"""Encoder and decoder layers of the Transformer (Vaswani et al., 2017, §3.1, §3.3, §5.4).

Every sub-layer is wrapped as in the paper (post-LN, the default):

    LayerNorm(x + Dropout(Sublayer(x)))

or, with ``normalize_before`` (pre-LN, later practice):

    x + Dropout(Sublayer(LayerNorm(x)))

The feed-forward sub-layer is FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (eq. 2), with optional
dropout on the ReLU output (``activation_dropout``). Parameter names follow fairseq's
layers (``self_attn``, ``self_attn_layer_norm``, ``encoder_attn``, ``fc1``, ...).
Tensors are batch-first, [B, T, d_model].
"""
from typing import Optional, Tuple

import torch.nn.functional as F
from fairseq.modules import FairseqDropout
from torch import Tensor, nn

from fairseq_plugins.modules.beam_cache import BeamCache
from fairseq_plugins.modules.multihead_attention import MultiheadAttention


FFN_INITS = ("linear", "xavier")


def _ffn_linear(in_features: int, out_features: int, init: str) -> nn.Linear:
    """``linear``: nn.Linear's U(±1/√fan_in) weights and biases, as fairseq's ``transformer``;
    ``xavier``: Xavier-uniform weights, zero biases (the paper says nothing of either)."""
    m = nn.Linear(in_features, out_features)
    if init == "xavier":
        nn.init.xavier_uniform_(m.weight)
        nn.init.zeros_(m.bias)
    return m


class _Layer(nn.Module):
    """What both layers share: the FFN and the residual/LayerNorm wrapping."""

    def __init__(self, d_model: int, d_ff: int, dropout: float, activation_dropout: float,
                 normalize_before: bool, ffn_init: str):
        super().__init__()
        # fairseq's module, so that --retain-dropout(-modules) can keep it on in generation
        self.dropout_module = FairseqDropout(dropout, module_name=self.__class__.__name__)  # P_drop
        self.activation_dropout_module = FairseqDropout(activation_dropout, module_name=self.__class__.__name__)
        self.normalize_before = normalize_before
        self.fc1 = _ffn_linear(d_model, d_ff, ffn_init)  # W_1, b_1
        self.fc2 = _ffn_linear(d_ff, d_model, ffn_init)  # W_2, b_2
        self.final_layer_norm = nn.LayerNorm(d_model)

    def _residual(self, x: Tensor, sublayer_out: Tensor, norm: nn.LayerNorm) -> Tensor:
        x = x + self.dropout_module(sublayer_out)  # x + Dropout(Sublayer)
        return x if self.normalize_before else norm(x)  # LayerNorm(x + Dropout(Sublayer(x)))

    def _input(self, x: Tensor, norm: nn.LayerNorm) -> Tensor:
        return norm(x) if self.normalize_before else x

    def _ffn(self, x: Tensor) -> Tensor:
        h = F.relu(self.fc1(self._input(x, self.final_layer_norm)))  # max(0, x W_1 + b_1)
        h = self.activation_dropout_module(h)
        return self._residual(x, self.fc2(h), self.final_layer_norm)  # (…) W_2 + b_2


class TransformerEncoderLayer(_Layer):
    """Self-attention, then the FFN (§3.1)."""

    def __init__(self, d_model: int, d_ff: int, heads: int, dropout: float = 0.1,
                 attention_dropout: float = 0.0, activation_dropout: float = 0.0,
                 normalize_before: bool = False, ffn_init: str = "linear"):
        super().__init__(d_model, d_ff, dropout, activation_dropout, normalize_before, ffn_init)
        self.self_attn = MultiheadAttention(d_model, heads, attention_dropout)
        self.self_attn_layer_norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor, attn_mask: Optional[Tensor]) -> Tensor:
        """x: [B, S, d_model]; attn_mask: bool [B, 1, 1, S] (True on words) or None."""
        y, _ = self.self_attn(self._input(x, self.self_attn_layer_norm), attn_mask=attn_mask)
        x = self._residual(x, y, self.self_attn_layer_norm)
        return self._ffn(x)


class TransformerDecoderLayer(_Layer):
    """Masked self-attention, encoder–decoder attention, then the FFN (§3.1)."""

    def __init__(self, d_model: int, d_ff: int, heads: int, dropout: float = 0.1,
                 attention_dropout: float = 0.0, activation_dropout: float = 0.0,
                 normalize_before: bool = False, encoder_dim: Optional[int] = None, ffn_init: str = "linear",
                 layer: int = 0):
        super().__init__(d_model, d_ff, dropout, activation_dropout, normalize_before, ffn_init)
        # layer: its index in the decoder, where its attentions keep their tensors in a BeamCache
        self.self_attn = MultiheadAttention(d_model, heads, attention_dropout, layer=layer)
        self.self_attn_layer_norm = nn.LayerNorm(d_model)
        self.encoder_attn = MultiheadAttention(d_model, heads, attention_dropout,
                                               encoder_decoder_attention=True, kdim=encoder_dim, layer=layer)
        self.encoder_attn_layer_norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor, encoder_out: Optional[Tensor], encoder_attn_mask: Optional[Tensor],
                cache: Optional[BeamCache] = None, need_attn: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        """
        x: [N, T, d_model] (T = 1 when decoding step by step with ``cache``);
        encoder_out: [N, S, d_encoder] (None with a cache: it holds the encoder keys/values);
        encoder_attn_mask: bool [R, 1, 1, S] (R beams) or None.
        Returns x and, with ``need_attn``, the encoder–decoder attention [N, T, S].
        """
        y, _ = self.self_attn(self._input(x, self.self_attn_layer_norm),
                              causal=cache is None,  # a full sequence: mask future positions
                              cache=cache)
        x = self._residual(x, y, self.self_attn_layer_norm)
        y, attn = self.encoder_attn(self._input(x, self.encoder_attn_layer_norm), encoder_out,
                                    attn_mask=encoder_attn_mask, cache=cache, need_weights=need_attn)
        x = self._residual(x, y, self.encoder_attn_layer_norm)
        return self._ffn(x), attn
