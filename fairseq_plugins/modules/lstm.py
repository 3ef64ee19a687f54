"""A stack of LSTM layers, one time step, written as matrix products on ``nn.LSTM``'s own weights
(gates in its order [i; f; g; o], no peepholes)::

    [i; f; g; o] = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh
    c_t = σ(f) ∘ c_{t-1} + σ(i) ∘ tanh(g)
    h_t = σ(o) ∘ tanh(c_t)

so that a ``scan`` of it exports to ONNX as plain operators (``torch.lstm_cell`` does not).
"""
from typing import Tuple

import torch
from torch import Tensor


def lstm_cell(x: Tensor, h: Tensor, c: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor,
              b_hh: Tensor) -> Tuple[Tensor, Tensor]:
    """(h_t, c_t) from x_t (bsz, in), h_{t-1} and c_{t-1} (bsz, H) and one layer's weights."""
    i, f, g, o = (x @ w_ih.t() + b_ih + h @ w_hh.t() + b_hh).chunk(4, dim=-1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def stacked_lstm_step(state: Tensor, x: Tensor, pad: Tensor, *weights: Tensor) -> Tensor:
    """A scan step over every layer: ``state`` (2, layers, bsz, H) holds (h, c) per layer, ``x``
    (bsz, in) the input, ``pad`` (bsz, 1) True where the state is kept unchanged (padding);
    ``weights`` four per layer, as ``nn.LSTM.all_weights`` lists them. Returns the new state."""
    new = []
    for k in range(state.size(1)):
        h, c = lstm_cell(x, state[0, k], state[1, k], *weights[4 * k: 4 * k + 4])
        new.append(torch.stack([h, c]))
        x = h  # the next layer's input (eval mode: no dropout between layers)
    return torch.where(pad, state, torch.stack(new, dim=1))
