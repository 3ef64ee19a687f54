"""The layers of :mod:`modeling_fairseq_rnn` (the papers' GRU, additive attention, the
conditional GRU cell, the source reversal): copies of ``fairseq_plugins/modules`` (and
``seq2seq_lstm``'s reversal) in torch alone, since this file ships inside every exported folder
(imported by ``modeling_fairseq_rnn.py``, loaded with ``trust_remote_code=True``) where fairseq
need not be installed. Same parameter names and functions as the originals;
``tests/unit/export/test_export_hf_rnn.py`` holds each copy to its original on random weights.
"""
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class BatchedLinear(nn.Module):
    """One weight (out × in) per direction: ``weight`` (directions, out, in)."""

    def __init__(self, directions: int, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(directions, out_features, in_features))


class PaperGRU(nn.Module):
    """One layer of the papers' GRU, one or two directions; rows stacked as [z; r; candidate]::

        z_j = σ(W_z x_j + U_z h_{j-1}),  r_j = σ(W_r x_j + U_r h_{j-1})
        h̃_j = tanh(W x_j + U [r_j ∘ h_{j-1}]),  h_j = (1 - z_j) ∘ h_{j-1} + z_j ∘ h̃_j
    """

    def __init__(self, input_size: int, hidden_size: int, directions: int):
        super().__init__()
        self.hidden_size, self.directions = hidden_size, directions
        self.W = nn.Linear(input_size, directions * 3 * hidden_size)  # [W_z; W_r; W] x + b per direction
        self.U_zr = BatchedLinear(directions, hidden_size, 2 * hidden_size)
        self.U = BatchedLinear(directions, hidden_size, hidden_size)

    def forward(self, x: Tensor, padding_mask: Tensor) -> Tuple[Tensor, Tensor]:
        """x (B, S, in), padding_mask (B, S) -> outputs (B, S, D·n), zero at padding, and the final
        state of each direction (D, B, n): ``→h_T`` and ``←h_1``."""
        B, S, _ = x.shape
        n = self.hidden_size
        Wx = self.W(x).view(B, S, self.directions, 3 * n)
        keep = (~padding_mask).unsqueeze(2)  # (B, S, 1)
        outputs, finals = [], []
        for d in range(self.directions):  # d = 1 reads right to left
            U_zr, U = self.U_zr.weight[d], self.U.weight[d]
            h = x.new_zeros(B, n)  # h_0 = 0
            states: List[Optional[Tensor]] = [None] * S
            for j in (range(S) if d == 0 else reversed(range(S))):
                x_j = Wx[:, j, d]
                z, r = torch.sigmoid(x_j[:, : 2 * n] + h @ U_zr.t()).chunk(2, dim=1)
                h_tilde = torch.tanh(x_j[:, 2 * n:] + (r * h) @ U.t())
                h = torch.where(keep[:, j], (1 - z) * h + z * h_tilde, h)  # padding keeps h_{j-1}
                states[j] = h
            outputs.append(torch.stack(states, dim=1))
            finals.append(h)
        out = torch.cat(outputs, dim=2).masked_fill(padding_mask.unsqueeze(2), 0.0)
        return out, torch.stack(finals)


class AdditiveAttention(nn.Module):
    """``e_ij = v_aᵀ tanh(W_a s_{i-1} + U_a h_j)``, ``α_i = softmax(e_i)``, ``c_i = Σ_j α_ij h_j``
    (``U_a``'s bias is the alignment MLP's)."""

    def __init__(self, query_size: int, annotation_size: int, hidden_size: int):
        super().__init__()
        self.W_a = nn.Linear(query_size, hidden_size, bias=False)
        self.U_a = nn.Linear(annotation_size, hidden_size)
        self.v_a = nn.Linear(hidden_size, 1, bias=False)

    def forward(self, s_prev: Tensor, U_a_h: Tensor, h: Tensor, padding_mask: Tensor) -> Tuple[Tensor, Tensor]:
        """s_prev (B, n), U_a_h (B, S, n'), h (B, S, 2n), padding_mask (B, S) -> c (B, 2n), α (B, S)."""
        e = self.v_a(torch.tanh(self.W_a(s_prev).unsqueeze(1) + U_a_h)).squeeze(2)
        alpha = F.softmax(e.masked_fill(padding_mask, float("-inf")), dim=1)
        return torch.bmm(alpha.unsqueeze(1), h).squeeze(1), alpha


class ConditionalGRUCell(nn.Module):
    """``s_i`` from ``W E y_{i-1}`` (with the bias), ``C c_i`` and ``s_{i-1}``: the GRU above whose
    gates and candidate also see the context (Bahdanau et al., appendix A.2.2)."""

    def __init__(self, input_size: int, hidden_size: int, context_size: int):
        super().__init__()
        self.W = nn.Linear(input_size, 3 * hidden_size)
        self.C = nn.Linear(context_size, 3 * hidden_size, bias=False)
        self.U_zr = nn.Linear(hidden_size, 2 * hidden_size, bias=False)
        self.U = nn.Linear(hidden_size, hidden_size, bias=False)

    def forward(self, W_Ey: Tensor, C_c: Tensor, s_prev: Tensor) -> Tensor:
        x = W_Ey + C_c  # (B, 3n)
        n = s_prev.size(1)
        z, r = torch.sigmoid(x[:, : 2 * n] + self.U_zr(s_prev)).chunk(2, dim=1)
        s_tilde = torch.tanh(x[:, 2 * n:] + self.U(r * s_prev))
        return (1 - z) * s_prev + z * s_tilde


def reverse_words(tokens: Tensor, words: Tensor) -> Tensor:
    """Each row's words (``words`` True) in reverse order; other positions (padding, ``</s>``) stay."""
    n = words.sum(dim=1, keepdim=True)
    first = words.to(torch.uint8).argmax(dim=1, keepdim=True)  # position of the first word
    positions = torch.arange(tokens.size(1), device=tokens.device).unsqueeze(0)
    return tokens.gather(1, torch.where(words, 2 * first + n - 1 - positions, positions))
