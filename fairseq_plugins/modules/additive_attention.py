"""Additive alignment model of Bahdanau et al. (2015), section 3.1 and appendix A.1.2."""
from typing import Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor


class _AlignmentEnergies(torch.autograd.Function):
    """``e_gij = v_aᵀ tanh(W_a s_gi + U_a h_gj)`` for every query i of beam g and annotation j.

    Autograd would keep ``tanh(·)`` (bsz·G·src_len·n' floats) of every decoder step for the
    backward pass; this keeps only the inputs (``W_a s``: bsz·G·n') and recomputes the tanh
    there, which is what made rnnsearch's training memory exceed fairseq's ``lstm``.
    """

    @staticmethod
    def forward(ctx, W_a_s: Tensor, U_a_h: Tensor, v_a: Tensor) -> Tensor:
        ctx.save_for_backward(W_a_s, U_a_h, v_a)
        hidden = _hidden(W_a_s, U_a_h)
        return torch.matmul(hidden, v_a.to(hidden.dtype))  # (bsz, G, src_len)

    @staticmethod
    def backward(ctx, grad_e: Tensor):
        W_a_s, U_a_h, v_a = ctx.saved_tensors
        hidden = _hidden(W_a_s, U_a_h)  # recomputed: tanh(W_a s + U_a h), (bsz, G, src_len, n')
        grad_e, v = grad_e.to(hidden.dtype), v_a.to(hidden.dtype)
        grad_v = torch.matmul(grad_e.reshape(1, -1), hidden.view(-1, hidden.size(-1))).view(-1)
        # d e / d(pre-activation) = v_a ∘ (1 - tanh²): three passes over the (bsz, G, src_len, n') tensor
        grad_pre = torch.addcmul(v, v, hidden.mul_(hidden), value=-1.0).mul_(grad_e.unsqueeze(-1))
        grad_U_a_h = grad_pre.squeeze(1) if grad_pre.size(1) == 1 else grad_pre.sum(dim=1)
        return grad_pre.sum(dim=2).to(W_a_s.dtype), grad_U_a_h.to(U_a_h.dtype), grad_v.to(v_a.dtype)


def _hidden(W_a_s: Tensor, U_a_h: Tensor) -> Tensor:
    """tanh(W_a s_gi + U_a h_gj): (bsz, G, n') and (bsz, src_len, n') -> (bsz, G, src_len, n')."""
    return torch.add(W_a_s.unsqueeze(2), U_a_h.unsqueeze(1)).tanh_()


def alignment_energies(W_a_s: Tensor, U_a_h: Tensor, v_a: Tensor) -> Tensor:
    """``e_gij = v_aᵀ tanh(W_a s_gi + U_a h_gj)`` as one expression, for ``torch.compile``: it
    becomes one loop that never writes the (bsz, G, src_len, n') tanh, which eager decoding writes
    and reads back three times per step (the sums' order differs from the matmul's: rounding)."""
    pre = torch.add(W_a_s.unsqueeze(2), U_a_h.unsqueeze(1))
    # tanh x = 1 - 2 / (e^{2x} + 1): inductor's vectorised exp is 3.5x faster than its tanh
    # (AVX-512), as close to float64's tanh (7e-7 on decoding's sizes); ±1 at ±inf, NaN kept
    hidden = 1.0 - 2.0 / (torch.exp(2.0 * pre) + 1.0)
    return (hidden * v_a.to(hidden.dtype)).sum(dim=3)  # (bsz, G, src_len)


class AdditiveAttention(nn.Module):
    """``e_ij = v_aᵀ tanh(W_a s_{i-1} + U_a h_j)``, ``α_ij = softmax_j(e_ij)``, ``c_i = Σ_j α_ij h_j``.

    ``U_a h_j`` does not depend on the decoder step: the caller computes it once per
    sentence with :meth:`project_annotations` and passes it to every :meth:`forward`.
    The bias of the alignment MLP (omitted from the paper's equations, zero at init)
    lives in ``U_a`` so that it is precomputed too.

    Args:
        query_size: n, size of the decoder state ``s_{i-1}``.
        annotation_size: 2n, size of an annotation ``h_j``.
        hidden_size: n', size of the alignment model's hidden layer.
    """

    def __init__(self, query_size: int, annotation_size: int, hidden_size: int):
        super().__init__()
        self.W_a = nn.Linear(query_size, hidden_size, bias=False)
        self.U_a = nn.Linear(annotation_size, hidden_size)
        self.v_a = nn.Linear(hidden_size, 1, bias=False)
        self.compiled_energies = None  # alignment_energies compiled, used without autograd (compile_energies)

    def compile_energies(self) -> None:
        """From now on the energies of decoding (no autograd) come from :func:`alignment_energies`
        compiled by ``torch.compile`` for any batch and source length; training keeps the eager
        autograd function. Compiling happens at the first call (torch caches the code on disk)."""
        self.compiled_energies = torch.compile(alignment_energies, dynamic=True)

    def project_annotations(self, h: Tensor) -> Tensor:
        """``U_a h_j`` for every j: (bsz, src_len, 2n) -> (bsz, src_len, n')."""
        return self.U_a(h)

    def forward(self, s_prev: Tensor, U_a_h: Tensor, h: Tensor, padding_mask: Tensor) -> Tuple[Tensor, Tensor]:
        """
        Args:
            s_prev: (bsz, n) decoder states ``s_{i-1}``, or (bsz, G, n): G states (a beam's
                hypotheses) that read the same sentence.
            U_a_h: (bsz, src_len, n') from :meth:`project_annotations`.
            h: (bsz, src_len, 2n) annotations.
            padding_mask: (bsz, src_len), True at padding (those get zero weight).

        Returns:
            c_i: (bsz, [G,] 2n) context vectors; α_i: (bsz, [G,] src_len) alignment weights.
        """
        per_beam = s_prev.dim() == 3  # G queries per sentence
        W_a_s = self.W_a(s_prev if per_beam else s_prev.unsqueeze(1))  # (bsz, G, n')
        e = self._energies(W_a_s, U_a_h, self.v_a.weight.view(-1))  # e_ij: (bsz, G, src_len)
        e = e.masked_fill(padding_mask.unsqueeze(1), float("-inf"))
        alpha = F.softmax(e, dim=2)  # α_ij = exp(e_ij) / Σ_k exp(e_ik)
        c = torch.bmm(alpha.to(h.dtype), h)  # c_i = Σ_j α_ij h_j: (bsz, G, 2n)
        return (c, alpha) if per_beam else (c.squeeze(1), alpha.squeeze(1))

    def _energies(self, W_a_s: Tensor, U_a_h: Tensor, v_a: Tensor) -> Tensor:
        if self.compiled_energies is not None and not torch.is_grad_enabled():
            return self.compiled_energies(W_a_s, U_a_h, v_a)
        return _AlignmentEnergies.apply(W_a_s, U_a_h, v_a)
