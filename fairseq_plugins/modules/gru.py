"""Gated recurrent units exactly as Bahdanau et al. (2015, appendix A) and Cho et al. (2014a)
write them — the reset gate applies *before* the recurrent matrix::

    z_j = σ(W_z x_j + U_z h_{j-1})
    r_j = σ(W_r x_j + U_r h_{j-1})
    h̃_j = tanh(W x_j + U [r_j ∘ h_{j-1}])
    h_j = (1 - z_j) ∘ h_{j-1} + z_j ∘ h̃_j

(``torch.nn.GRU`` computes ``r_j ∘ (U h_{j-1} + b)`` instead, a different function, and
names the update gate the other way round.)

One matrix per input group, rows stacked as [z; r; candidate]: ``W`` (with the biases,
omitted from the paper's equations), ``U_zr`` and ``U``. The input projections do not
depend on the state, so they are computed for all time steps in one matmul; the loop over
time only does the two recurrent matmuls.
"""
from typing import Tuple

import torch
import torch.nn as nn
from torch import Tensor

from fairseq_plugins.modules.recurrence import scan_over_time


def update_reset_gates(x: Tensor, U_zr_h: Tensor) -> Tuple[Tensor, Tensor]:
    """z_j = σ(W_z x_j + U_z h_{j-1}) and r_j = σ(W_r x_j + U_r h_{j-1}) from the projections
    ``x`` (..., 3n) and ``U_zr h_{j-1}`` (..., 2n)."""
    n = U_zr_h.size(-1) // 2
    z, r = torch.sigmoid(x[..., : 2 * n] + U_zr_h).chunk(2, dim=-1)
    return z, r


def candidate(x: Tensor, U_rh: Tensor) -> Tensor:
    """h̃_j = tanh(W x_j + U [r_j ∘ h_{j-1}]) from ``x`` (..., 3n) and ``U [r_j ∘ h_{j-1}]``."""
    return torch.tanh(x[..., 2 * U_rh.size(-1):] + U_rh)


def gru_step(h: Tensor, Wx_j: Tensor, keep_j: Tensor, U_zr: Tensor, U: Tensor) -> Tuple[Tensor, Tensor]:
    """One step of every direction: h_j from h_{j-1} (D, bsz, n), W x_j (D, bsz, 3n), keep_j
    (D, bsz, 1; 0 at padding) and the recurrent weights U_zr (D, 2n, n), U (D, n, n). Returns h_j
    twice, as a scan step's carry and output. A function of its inputs only: ``scan`` takes the
    weights as inputs, so that autograd and ``torch.export`` see them."""
    z, r = update_reset_gates(Wx_j, torch.bmm(h, U_zr.transpose(1, 2)))
    h_tilde = candidate(Wx_j, torch.bmm(r * h, U.transpose(1, 2)))
    h = h + (keep_j * z) * (h_tilde - h)  # h_j = (1 - z_j) ∘ h_{j-1} + z_j ∘ h̃_j; padding keeps h_{j-1}
    return h, h


class BatchedLinear(nn.Module):
    """One weight (out × in) per direction; :func:`gru_step` applies all of them with one bmm."""

    def __init__(self, directions: int, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(directions, out_features, in_features))
        for w in self.weight:
            nn.init.kaiming_uniform_(w, a=5 ** 0.5)  # nn.Linear's default


class GRU(nn.Module):
    """The paper's GRU over whole sentences, one or two directions (``→h`` reads left to
    right, ``←h`` right to left), run together in one loop over time.

    Padding may be on either side: the state is carried unchanged over padding, so each
    direction's state at a real token, and its final state, do not depend on the padding.
    """

    def __init__(self, input_size: int, hidden_size: int, bidirectional: bool = False):
        super().__init__()
        self.hidden_size = hidden_size
        self.directions = 2 if bidirectional else 1
        self.W = nn.Linear(input_size, self.directions * 3 * hidden_size)  # [W_z; W_r; W] of each direction
        self.U_zr = BatchedLinear(self.directions, hidden_size, 2 * hidden_size)  # [U_z; U_r]
        self.U = BatchedLinear(self.directions, hidden_size, hidden_size)

    def step(self, h: Tensor, Wx_j: Tensor, keep_j: Tensor) -> Tensor:
        """h_j from h_{j-1} (D, bsz, n), W x_j (D, bsz, 3n) and keep_j (D, bsz, 1): 0 at padding."""
        return gru_step(h, Wx_j, keep_j, self.U_zr.weight, self.U.weight)[0]

    def _recur(self, Wx: Tensor, keep: Tensor, h: Tensor) -> Tuple[Tensor, Tensor]:
        """The final h (D, bsz, n) and every h_j (len, D, bsz, n)."""
        if not torch.jit.is_scripting():  # TorchScript cannot compile scan: it keeps the loop
            if not torch.is_grad_enabled():  # generation and torch.export: one scan
                return self._scan(Wx, keep, h)
        states = []  # training: scan's own backward is several times slower than this loop's
        # unbind, not Wx[j]: each indexing's backward would allocate a zero tensor of the whole sequence
        for Wx_j, keep_j in zip(Wx.unbind(0), keep.unbind(0)):
            h = self.step(h, Wx_j, keep_j)
            states.append(h)
        return h, torch.stack(states, dim=0)

    def _scan(self, Wx: Tensor, keep: Tensor, h: Tensor) -> Tuple[Tensor, Tensor]:
        return scan_over_time(gru_step, h, [Wx, keep], [self.U_zr.weight, self.U.weight])

    def forward(self, x: Tensor, padding_mask: Tensor) -> Tuple[Tensor, Tensor]:
        """
        Args:
            x: (bsz, len, input_size); padding_mask: (bsz, len), True at padding.

        Returns:
            outputs (bsz, len, directions·n) — ``[→h_j; ←h_j]``, zero at padding — and the
            final states (directions, bsz, n): ``→h_T`` and ``←h_1``.
        """
        bsz, length, _ = x.shape
        D, n = self.directions, self.hidden_size
        Wx = self.W(x).view(bsz, length, D, 3 * n).permute(1, 2, 0, 3)  # (len, D, bsz, 3n)
        keep = (~padding_mask).t().to(x.dtype).unsqueeze(1).unsqueeze(3)  # (len, 1, bsz, 1)
        keep = keep.expand(length, D, bsz, 1)
        if D == 2:  # the backward direction's step j reads position len-1-j
            Wx = torch.stack((Wx[:, 0], Wx[:, 1].flip(0)), dim=1)
            keep = torch.stack((keep[:, 0], keep[:, 1].flip(0)), dim=1)
        h = x.new_zeros(D, bsz, n)  # h_0 = 0
        h, H = self._recur(Wx, keep, h)  # final h (D, bsz, n), every h_j (len, D, bsz, n)
        directions = [H[:, 0]] if D == 1 else [H[:, 0], H[:, 1].flip(0)]
        out = torch.cat(directions, dim=2).transpose(0, 1)  # (bsz, len, D·n)
        return out.masked_fill(padding_mask.unsqueeze(2), 0.0), h
