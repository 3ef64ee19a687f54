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

Decoding step by step, both keep their keys and values in fairseq's incremental state, for
R groups of G consecutive query rows (G = 1, or the beam size when the decoder decodes beams:
a beam's hypotheses share one source sentence). A group's rows attend together as one
[h, G, d_k] query block:

- encoder–decoder (``static_kv``): ``kv`` [R, 2, h, S, d_k], computed once per group, i.e.
  once per source sentence in beam search;
- self-attention (``self_kv``): ``kv`` [R, t, G, 2, h, d_k], step-major and slot-minor: step
  j's entries stay in the slot of the hypothesis that wrote them, and each hypothesis reads
  its ancestors' slots through the decoder's additive ``slot_mask``. Eagerly ``kv`` is a view
  of ``buf`` [R, capacity, G, 2, h, d_k], preallocated and written in place (capacity doubles
  when full); a cache handed in without ``buf`` (the exported decoder step's state) grows by
  concatenation, which ``torch.export`` traces for any length.

:meth:`reorder_cache` selects groups (or rows, G = 1) of both caches.
"""
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.modules import FairseqDropout
from torch import Tensor, nn

from fairseq_plugins.errors import ConfigError

IncrementalState = Dict[str, Dict[str, Optional[Tensor]]]
INITIAL_CAPACITY = 16  # decoding steps the self-attention buffer holds before it first doubles


@with_incremental_state
class MultiheadAttention(nn.Module):
    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0,
                 encoder_decoder_attention: bool = False, kdim: Optional[int] = None):
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ConfigError(f"embedding dimension {embed_dim} is not divisible by the "
                             f"number of attention heads {num_heads}")
        self.embed_dim = embed_dim
        self.num_heads = num_heads  # h
        self.d_k = embed_dim // num_heads  # d_k = d_v = d_model / h
        self.dropout_module = FairseqDropout(dropout, module_name=self.__class__.__name__)  # on the weights
        self.encoder_decoder_attention = encoder_decoder_attention
        if encoder_decoder_attention:
            self.q_proj = nn.Linear(embed_dim, embed_dim)  # W^Q
            self.kv_proj = nn.Linear(kdim or embed_dim, 2 * embed_dim)  # [W^K; W^V]
            projections = (self.q_proj.weight, *self.kv_proj.weight.chunk(2))
        else:
            self.in_proj = nn.Linear(embed_dim, 3 * embed_dim)  # [W^Q; W^K; W^V]
            projections = self.in_proj.weight.chunk(3)
        self.out_proj = nn.Linear(embed_dim, embed_dim)  # W^O
        # fairseq's initialisation: Xavier per projection (gain 1/√2), zero output bias
        for w in projections:
            nn.init.xavier_uniform_(w, gain=2**-0.5)
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
        incremental_state: Optional[IncrementalState] = None,
        need_weights: bool = False,
        group: int = 1,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """
        Args:
            query: [N, T, d_model].
            key: [N / group, S, kdim] encoder output (encoder–decoder attention; unused once
                ``incremental_state`` holds its keys and values).
            attn_mask: bool [N / group, 1, 1, S], True where a key may be attended; in incremental
                self-attention the decoder's additive slot mask [N / G, 1, G, (t+1)·G], or None (G = 1).
            causal: mask future positions (decoder self-attention over a full sequence).
            need_weights: also return the attention weights averaged over heads, [N, T, S].
            group: G, the number of consecutive query rows that share keys (incremental only).
        Returns:
            output [N, T, d_model] and the weights or None.
        """
        num_rows, tgt_len, _ = query.shape
        if self.encoder_decoder_attention:
            q = self._split(self.q_proj(query), 1)[:, 0]  # Q W^Q: [N, h, T, d_k]
            cache = None if incremental_state is None else self.get_incremental_state(incremental_state, "static_kv")
            if cache is None:
                kv = self.encoder_kv(key)  # [N / group, 2, h, S, d_k]
                if incremental_state is not None:
                    self.set_incremental_state(incremental_state, "static_kv", {"kv": kv})
            else:
                kv = cache["kv"]
            # a group's rows become one query block: [N / group, h, group·T, d_k]
            q = q.transpose(1, 2).reshape(-1, group * tgt_len, self.num_heads, self.d_k).transpose(1, 2)
        else:
            qkv = self._split(self.in_proj(query), 3)  # [N, 3, h, T, d_k]
            q, kv = qkv[:, 0], qkv[:, 1:]
            if incremental_state is not None:
                q, kv = self._append_to_cache(incremental_state, q, kv, group)
        k, v = kv[:, 0], kv[:, 1]
        # the fused kernel takes dropout as a probability; FairseqDropout says when it applies
        drop = self.dropout_module
        dropout_p = drop.p if self.training or drop.apply_during_inference else 0.0
        # CPU's fused attention backward in bf16 ran 3-10x slower than in fp32 (torch 2.13, Xeon
        # with AVX512-BF16 and AMX; docs/BENCHMARKS.md): autocast training takes the explicit path
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

    def encoder_kv(self, key: Tensor) -> Tensor:
        """[K W^K, V W^V] of the encoder output [B, S, kdim]: [B, 2, h, S, d_k]."""
        return self._split(self.kv_proj(key), 2)

    def _append_to_cache(self, incremental_state: IncrementalState, q: Tensor, kv: Tensor,
                         group: int) -> Tuple[Tensor, Tensor]:
        """Adds this step's keys/values ``kv`` [N, 2, h, 1, d_k] to the cache. Returns the queries
        as group blocks [R, h, G, d_k] and the group's keys and values [R, 2, h, (t+1)·G, d_k]."""
        rows = q.size(0) // group
        new = kv.squeeze(3).reshape(rows, 1, group, 2, self.num_heads, self.d_k)
        cache = self.get_incremental_state(incremental_state, "self_kv")
        if cache is not None and cache["buf"] is None:  # handed in (exported step): concatenated
            buf, cached = None, torch.cat([cache["kv"], new], dim=1)
        else:
            if cache is None:  # first step
                buf, t = new.new_empty(rows, INITIAL_CAPACITY, group, 2, self.num_heads, self.d_k), 0
            else:
                buf, t = cache["buf"], cache["kv"].size(1)
            if t == buf.size(1):  # full: double the capacity (amortised O(1) copies per step)
                bigger = buf.new_empty(rows, 2 * t, *buf.shape[2:])
                bigger[:, :t] = buf
                buf = bigger
            buf[:, t] = new[:, 0]
            cached = buf[:, :t + 1]
        self.set_incremental_state(incremental_state, "self_kv", {"buf": buf, "kv": cached})
        steps = cached.size(1)
        keys = cached.reshape(rows, steps * group, 2, self.num_heads, self.d_k)  # step-major, slot-minor
        q = q.transpose(1, 2).reshape(rows, group, self.num_heads, self.d_k).transpose(1, 2)
        return q, keys.permute(0, 2, 3, 1, 4)

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

    def reorder_cache(self, incremental_state: IncrementalState, index: Tensor):
        """New group (row, for G = 1) g continues old group ``index[g]``: both caches are selected
        along their first dimension."""
        for key in ("self_kv", "static_kv"):
            cache = self.get_incremental_state(incremental_state, key)
            if cache is None:
                continue
            buf = cache.get("buf")
            if buf is not None:
                steps = cache["kv"].size(1)
                buf = buf.index_select(0, index)
                cache = {"buf": buf, "kv": buf[:, :steps]}
            else:
                cache = {**cache, "kv": cache["kv"].index_select(0, index)}
            self.set_incremental_state(incremental_state, key, cache)
