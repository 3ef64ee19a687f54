"""Multi-head scaled dot-product attention (Vaswani et al., 2017, §3.2).

    Attention(Q, K, V) = softmax(QKᵀ / √d_k) V                                   (1)
    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,
        head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

Tensors are batch-first: queries [N, T, d_model], keys/values [B, S, kdim]. The attention
itself runs in ``torch.nn.functional.scaled_dot_product_attention`` (fused kernels on CPU
and GPU); the weights are materialised only when ``need_weights`` asks for them.

Self-attention projects Q, K and V with one fused [3·d_model, d_model] matrix (``in_proj``).
When decoding step by step it caches the keys and values of the tokens so far in a buffer
[R, capacity, G, 2, h, d_k] preallocated for several steps and written in place. In beam
search the G = beam hypotheses of a sentence form one group: step j's entries stay in the
slot of the hypothesis that wrote them, beam reorders move nothing, and each hypothesis
reads its own ancestors' slots through ``attn_mask`` (the decoder's ``slot_mask``), its group
attending as one [h, G, d_k] query block to the group's (t·G) keys. Rows that leave their
group (any other reorder) are gathered into groups of one (:meth:`reorder_cache`).

Encoder–decoder attention projects the queries with ``q_proj`` and the encoder output with
one fused [2·d_model, kdim] matrix (``kv_proj``). When decoding, keys and values are
computed once per *source sentence* ([B, h, S, d_k], cached) and never reordered: the
caller says which sentence each query row reads (``key_rows``) and how many consecutive
query rows share it (``group``, the beam size in beam search), and the rows of a group
attend together as one [h, group, d_k] query block.
"""
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.modules import FairseqDropout
from torch import Tensor, nn

from fairseq_plugins.errors import ConfigError

IncrementalState = Dict[str, Dict[str, Optional[Tensor]]]


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
        key_rows: Optional[Tensor] = None,
        group: int = 1,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """
        Args:
            query: [N, T, d_model].
            key: [B, S, kdim] encoder output (encoder–decoder attention; read once per
                sentence when ``incremental_state`` caches its keys and values).
            attn_mask: bool [N / group, 1, 1, S], True where a key may be attended; in incremental
                self-attention the decoder's additive slot mask [N / G, 1, G, (t+1)·G], or None (G = 1).
            causal: mask future positions (decoder self-attention over a full sequence).
            need_weights: also return the attention weights averaged over heads, [N, T, S].
            key_rows: [N / group] which row of ``key`` each query group reads (None: row i
                reads row i).
            group: number of consecutive query rows that read the same keys.
        Returns:
            output [N, T, d_model] and the weights or None.
        """
        num_rows, tgt_len, _ = query.shape
        if self.encoder_decoder_attention:
            q = self._split(self.q_proj(query), 1)[:, 0]  # Q W^Q: [N, h, T, d_k]
            kv = self._cached(incremental_state, "static_kv")
            if kv is None:
                kv = self._split(self.kv_proj(key), 2)  # [K W^K, V W^V]: [B, 2, h, S, d_k]
                if incremental_state is not None:
                    self.set_incremental_state(incremental_state, "static_kv", {"kv": kv})
            if key_rows is not None:
                kv = kv.index_select(0, key_rows)  # [N / group, 2, h, S, d_k]
            # a group's rows become one query block: [N / group, h, group·T, d_k]
            q = q.transpose(1, 2).reshape(-1, group * tgt_len, self.num_heads, self.d_k).transpose(1, 2)
        else:
            qkv = self._split(self.in_proj(query), 3)  # [N, 3, h, T, d_k]
            q, kv = qkv[:, 0], qkv[:, 1:]
            if incremental_state is not None:
                q, kv = self._append_to_cache(incremental_state, q, kv, attn_mask)
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

    def _append_to_cache(self, incremental_state: IncrementalState, q: Tensor, kv: Tensor,
                         slot_mask: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        """Writes this step's keys/values ``kv`` [N, 2, h, 1, d_k] into the buffer in place.
        Returns the queries as group blocks [R, h, G, d_k] and the group's keys and values
        [R, 2, h, (t+1)·G, d_k] (views of the buffer, step-major, slot-minor)."""
        group = 1 if slot_mask is None else slot_mask.size(2)
        rows = q.size(0) // group
        cache = self.get_incremental_state(incremental_state, "self_kv")
        if cache is None or cache["buf"] is None or cache["kv"] is None:
            buf = kv.new_empty(rows, 16, group, 2, self.num_heads, self.d_k)
            t = 0
        else:
            buf, t = cache["buf"], cache["kv"].size(1)
        if t == buf.size(1):  # full: double the capacity (amortised O(1) copies per step)
            bigger = buf.new_empty(rows, 2 * t, group, 2, self.num_heads, self.d_k)
            bigger[:, :t] = buf
            buf = bigger
        buf[:, t] = kv.squeeze(3).reshape(rows, group, 2, self.num_heads, self.d_k)
        self.set_incremental_state(incremental_state, "self_kv", {"buf": buf, "kv": buf[:, :t + 1]})
        keys = buf[:, :t + 1].reshape(rows, (t + 1) * group, 2, self.num_heads, self.d_k)  # a view
        q = q.transpose(1, 2).reshape(rows, group, self.num_heads, self.d_k).transpose(1, 2)
        return q, keys.permute(0, 2, 3, 1, 4)

    def _cached(self, incremental_state: Optional[IncrementalState], key: str) -> Optional[Tensor]:
        if incremental_state is None:
            return None
        cache = self.get_incremental_state(incremental_state, key)
        return None if cache is None else cache["kv"]

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

    def reorder_cache(self, incremental_state: IncrementalState, groups: Tensor,
                      ancestors: Optional[Tensor] = None):
        """Self-attention cache after a reorder. Without ``ancestors``: new group g is old group
        ``groups[g]`` (nothing moves when that is every group in order). With ``ancestors``
        [N', t] (rows left their groups): new row n becomes a group of one holding, for every
        step j, the entry of old group ``groups[n]``, slot ``ancestors[n, j]``."""
        cache = self.get_incremental_state(incremental_state, "self_kv")
        if cache is None or cache["buf"] is None or cache["kv"] is None:
            return
        buf, t = cache["buf"], cache["kv"].size(1)
        rows, capacity, group = buf.shape[:3]
        if ancestors is not None:
            steps = torch.arange(t, device=buf.device)
            index = (groups.unsqueeze(1) * capacity + steps) * group + ancestors  # [N', t] into [R·capacity·G]
            gathered = buf.view(rows * capacity * group, -1).index_select(0, index.view(-1))
            buf = buf.new_empty(groups.numel(), capacity, 1, *buf.shape[3:])
            buf[:, :t] = gathered.view(groups.numel(), t, 1, *buf.shape[3:])
        elif groups.numel() != rows or not torch.equal(groups, torch.arange(rows, device=groups.device)):
            buf = buf.index_select(0, groups)
        else:
            return
        self.set_incremental_state(incremental_state, "self_kv", {"buf": buf, "kv": buf[:, :t]})
