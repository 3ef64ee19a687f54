"""The decoder GRU of RNNsearch and RNNencdec (Bahdanau et al. 2015, appendix A.2.2): the
papers' GRU (:mod:`fairseq_plugins.modules.gru`) whose gates and candidate also see the context c_i.
"""
from torch import Tensor, nn

from fairseq_plugins.modules.gru import candidate, update_reset_gates


class ConditionalGRUCell(nn.Module):
    """One step of the decoder GRU whose gates and candidate all see ``E y_{i-1}``,
    ``s_{i-1}`` and ``c_i`` (appendix A.2.2)::

        z_i = σ(W_z E y_{i-1} + U_z s_{i-1} + C_z c_i)
        r_i = σ(W_r E y_{i-1} + U_r s_{i-1} + C_r c_i)
        s̃_i = tanh(W E y_{i-1} + U [r_i ∘ s_{i-1}] + C c_i)
        s_i = (1 - z_i) ∘ s_{i-1} + z_i ∘ s̃_i

    Matrices ``W`` (3n × m, with the biases), ``C`` (3n × k), ``U_zr`` (2n × n), ``U``
    (n × n). ``W E y`` does not depend on ``s_{i-1}``: callers compute it with
    :meth:`project_input` for all steps at once under teacher forcing; :meth:`project_context`
    gives ``C c_i``. Any leading dimensions (a beam's hypotheses: (R, G, ·)) broadcast.
    """

    def __init__(self, input_size: int, hidden_size: int, context_size: int):
        super().__init__()
        self.W = nn.Linear(input_size, 3 * hidden_size)
        self.C = nn.Linear(context_size, 3 * hidden_size, bias=False)
        self.U_zr = nn.Linear(hidden_size, 2 * hidden_size, bias=False)
        self.U = nn.Linear(hidden_size, hidden_size, bias=False)

    def project_input(self, Ey: Tensor) -> Tensor:
        """[W_z; W_r; W] E y_{i-1} + b: (..., m) -> (..., 3n)."""
        return self.W(Ey)

    def project_context(self, c: Tensor) -> Tensor:
        """[C_z; C_r; C] c_i: (..., k) -> (..., 3n)."""
        return self.C(c)

    def forward(self, W_Ey: Tensor, C_c: Tensor, s_prev: Tensor) -> Tensor:
        """``W_Ey``, ``C_c``: (..., 3n) projections; ``s_prev``: (..., n). Returns s_i (..., n)."""
        x = W_Ey + C_c
        z, r = update_reset_gates(x, self.U_zr(s_prev))
        s_tilde = candidate(x, self.U(r * s_prev))  # s̃_i = tanh(W E y_{i-1} + U [r_i ∘ s_{i-1}] + C c_i)
        return s_prev + z * (s_tilde - s_prev)  # s_i = (1 - z_i) ∘ s_{i-1} + z_i ∘ s̃_i
