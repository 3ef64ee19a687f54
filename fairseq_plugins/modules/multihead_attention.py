"""Multi-head scaled dot-product attention (Vaswani et al., 2017, §3.2).

    Attention(Q, K, V) = softmax(QKᵀ / √d_k) V                                   (1)
    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,
        head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

Tensors are batch-first: queries [N, T, d_model], keys/values [B, S, kdim]. The attention
itself runs in ``torch.nn.functional.scaled_dot_product_attention`` (fused kernels on CPU
and GPU); the weights are materialised only when ``need_weights`` asks for them.

Self-attention projects Q, K and V with one fused [3·d_model, d_model] matrix (``in_proj``).
Encoder–decoder attention projects the queries with ``q_proj`` and the encoder output with
one fused [2·d_model, kdim] matrix (``kv_proj``).

Decoding step by step, both read and write a :class:`~fairseq_plugins.modules.beam_cache.BeamCache`,
as decoder layer ``layer`` (given at construction), heads first as attention reads them;
:meth:`MultiheadAttention.start_cache` fills it. For a beam size G > 1 (R = N / G beams, each of
G hypotheses of one source sentence) a beam's G rows attend together as one [h, G, d_k] query
block:

- encoder–decoder: keys and values ``per_beam`` [R, h, S, d_k] each, computed once per beam
  (named ``layers.<layer>.encoder_attn.k``, ``.v``);
- self-attention: the cache's ``self_attention(layer)`` entries [R, h, t·G, d_k] each, read
  step-major and slot-minor through the additive mask its ``update`` returns.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq.modules import FairseqDropout
from torch import Tensor, nn

from fairseq_plugins.errors import ConfigError
from fairseq_plugins.modules.beam_cache import BeamCache


class MultiheadAttention(nn.Module):
    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0,
                 encoder_decoder_attention: bool = False, kdim: Optional[int] = None, layer: int = 0):
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ConfigError(f"embedding dimension {embed_dim} is not divisible by the "
                             f"number of attention heads {num_heads}")
        self.embed_dim = embed_dim
        self.num_heads = num_heads  # h
        self.d_k = embed_dim // num_heads  # d_k = d_v = d_model / h
        self.dropout_module = FairseqDropout(dropout, module_name=self.__class__.__name__)  # on the weights
        self.encoder_decoder_attention = encoder_decoder_attention
        self.layer = layer  # its decoder layer's index: where its keys and values are in a BeamCache
        if encoder_decoder_attention:
            self.q_proj = nn.Linear(embed_dim, embed_dim)  # W^Q
            self.kv_proj = nn.Linear(kdim or embed_dim, 2 * embed_dim)  # [W^K; W^V]
            projections = (self.q_proj.weight, *self.kv_proj.weight.chunk(2))
        else:
            self.in_proj = nn.Linear(embed_dim, 3 * embed_dim)  # [W^Q; W^K; W^V]
            projections = self.in_proj.weight.chunk(3)
        self.out_proj = nn.Linear(embed_dim, embed_dim)  # W^O
        # fairseq's initialisation: Xavier per projection, gain 1/√2 where keys have the queries'
        # size (1 otherwise); zero output bias
        gain = 2**-0.5 if (kdim or embed_dim) == embed_dim else 1.0
        for w in projections:
            nn.init.xavier_uniform_(w, gain=gain)
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)

    def _split(self, x: Tensor, n: int) -> Tensor:
        """[B, L, n·d_model] -> [B, n, h, L, d_k] (a view)."""
        bsz, length, _ = x.shape
        return x.view(bsz, length, n, self.num_heads, self.d_k).permute(0, 2, 3, 1, 4)

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor] = None,
        attn_mask: Optional[Tensor] = None,
        causal: bool = False,
        cache: Optional[BeamCache] = None,
        need_weights: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """
        Args:
            query: [N, T, d_model].
            key: [N, S, kdim] encoder output (encoder–decoder attention without a cache).
            attn_mask: bool [R, 1, 1, S], True where a key may be attended (G = 1 without
                a cache); self-attention with a cache reads the mask its entries come with.
            causal: mask future positions (decoder self-attention over a full sequence).
            cache: decoding step by step (T = 1): keys and values come from, and self-attention's
                go to, the cache; its G consecutive query rows share keys.
            need_weights: also return the attention weights averaged over heads, [N, T, S].
        Returns:
            output [N, T, d_model] and the weights or None.
        """
        num_rows, tgt_len, _ = query.shape
        if self.encoder_decoder_attention:
            q = self._split(self.q_proj(query), 1)[:, 0]  # Q W^Q: [N, h, T, d_k]
            if cache is None:
                k, v = self.encoder_kv(key)
            else:  # [R, h, S, d_k] each
                k, v = (cache.per_beam[name] for name in self.encoder_kv_names())
        else:
            q, k, v = self._split(self.in_proj(query), 3).unbind(1)  # [N, h, T, d_k] each
            if cache is not None:  # all entries so far: [R, h, (t+1)·G, d_k] each, and the step's mask
                k, v, attn_mask = cache.self_attention(self.layer).update(k.squeeze(2), v.squeeze(2))
        if cache is not None:  # a beam's rows become one query block: [R, h, G·T, d_k]
            q = cache.group_queries(q)
        # the fused kernel takes dropout as a probability; FairseqDropout says when it applies
        drop = self.dropout_module
        dropout_p = drop.p if self.training or drop.apply_during_inference else 0.0
        # CPU's fused attention backward in bf16 ran 3-10x slower than in fp32 (torch 2.13, Xeon
        # with AVX512-BF16 and AMX; reports/benchmarks/README.md): autocast training takes the explicit path
        explicit = need_weights or (torch.is_grad_enabled() and q.device.type == "cpu"
                                    and torch.is_autocast_enabled("cpu"))
        if explicit:
            out, weights = self._attention_with_weights(q, k, v, attn_mask, causal, dropout_p)
            weights = weights.mean(dim=1).reshape(num_rows, tgt_len, -1) if need_weights else None  # [N, T, S]
        else:
            out = F.scaled_dot_product_attention(  # softmax(QKᵀ/√d_k) V, eq. (1)
                q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=causal)
            weights = None
        out = out.transpose(1, 2).reshape(num_rows, tgt_len, self.embed_dim)  # Concat(head_1..h)
        return self.out_proj(out), weights

    def encoder_kv(self, key: Tensor) -> Tuple[Tensor, ...]:
        """K W^K and V W^V of the encoder output [B, S, kdim]: [B, h, S, d_k] each."""
        return self._split(self.kv_proj(key), 2).unbind(1)

    def encoder_kv_names(self) -> Tuple[str, str]:
        """Encoder–decoder attention's keys' and values' names in a BeamCache's ``per_beam``."""
        return f"layers.{self.layer}.encoder_attn.k", f"layers.{self.layer}.encoder_attn.v"

    def start_cache(self, cache: BeamCache, encoder: Tensor) -> None:
        """Before the first step: encoder–decoder attention's keys and values of the encoder
        output [R, S, kdim] (once per beam), or room for self-attention's."""
        if self.encoder_decoder_attention:
            for name, tensor in zip(self.encoder_kv_names(), self.encoder_kv(encoder)):
                cache.per_beam[name] = tensor
        else:
            cache.self_attention(self.layer).reserve(self.num_heads, self.d_k, encoder)

    def _attention_with_weights(self, q: Tensor, k: Tensor, v: Tensor, attn_mask: Optional[Tensor],
                                causal: bool, dropout_p: float) -> Tuple[Tensor, Tensor]:
        """Eq. (1) with explicit weights: [B, h, T, d_k] and the weights [B, h, T, S]."""
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.d_k**-0.5  # QKᵀ/√d_k: [B, h, T, S]
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        elif attn_mask is not None:  # additive
            scores = scores + attn_mask
        if causal:
            future = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).type_as(scores)  # [B, h, T, S]
        out = torch.matmul(F.dropout(probs, p=dropout_p, training=dropout_p > 0), v)
        return out, probs
