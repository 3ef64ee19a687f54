"""Additive alignment model of Bahdanau et al. (2015), section 3.1 and appendix A.1.2."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor


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

    def project_annotations(self, h: Tensor) -> Tensor:
        """``U_a h_j`` for every j: (bsz, src_len, 2n) -> (bsz, src_len, n')."""
        return self.U_a(h)

    def forward(self, s_prev: Tensor, U_a_h: Tensor, h: Tensor, padding_mask: Tensor):
        """
        Args:
            s_prev: (bsz, n) decoder state ``s_{i-1}``.
            U_a_h: (bsz, src_len, n') from :meth:`project_annotations`.
            h: (bsz, src_len, 2n) annotations.
            padding_mask: (bsz, src_len), True at padding (those get zero weight).

        Returns:
            c_i: (bsz, 2n) context vector; α_i: (bsz, src_len) alignment weights.
        """
        # e_ij = v_aᵀ tanh(W_a s_{i-1} + U_a h_j): (bsz, src_len)
        e = self.v_a(torch.tanh(self.W_a(s_prev).unsqueeze(1) + U_a_h)).squeeze(2)
        e = e.masked_fill(padding_mask, float("-inf"))
        alpha = F.softmax(e, dim=1)  # α_ij = exp(e_ij) / Σ_k exp(e_ik)
        c = torch.bmm(alpha.unsqueeze(1), h).squeeze(1)  # c_i = Σ_j α_ij h_j
        return c, alpha
