"""The papers' equations written out, one sentence and one step at a time, reading only a
model's parameter tensors: the independent oracles of tests/unit/models/test_rnn_models.py (forward) and
tests/unit/models/test_training_oracle.py (training)."""
import torch


def ref_gru(x, W, b, U_z, U_r, U):
    """The paper's GRU over one sentence x (len, m); W (3n × m) rows [z; r; candidate]."""
    n = U.size(0)
    W_z, W_r, W_h = W[:n], W[n:2 * n], W[2 * n:]
    b_z, b_r, b_h = b[:n], b[n:2 * n], b[2 * n:]
    h, out = torch.zeros(n), []
    for x_j in x:
        z = torch.sigmoid(W_z @ x_j + b_z + U_z @ h)
        r = torch.sigmoid(W_r @ x_j + b_r + U_r @ h)
        h_tilde = torch.tanh(W_h @ x_j + b_h + U @ (r * h))
        h = (1 - z) * h + z * h_tilde
        out.append(h)
    return torch.stack(out)


def ref_encoder_gru(layer, x, d):
    """Direction d of a plugin ``GRU`` layer recomputed with ``ref_gru`` (backward reads reversed)."""
    n = layer.hidden_size
    W = layer.W.weight.view(layer.directions, 3 * n, -1)[d]
    b = layer.W.bias.view(layer.directions, 3 * n)[d]
    U_zr = layer.U_zr.weight[d]
    args = (W, b, U_zr[:n], U_zr[n:], layer.U.weight[d])
    return ref_gru(x, *args) if d == 0 else ref_gru(x.flip(0), *args).flip(0)


def ref_decoder(dec, s0, contexts_fn, y_prev, use_previous):
    """Step-by-step decoder of one sentence: returns logits (tgt_len, V) and the α rows."""
    n = dec.W_s.out_features
    cell = dec.cell
    W, b, C = cell.W.weight, cell.W.bias, cell.C.weight
    U_z, U_r, U = cell.U_zr.weight[:n], cell.U_zr.weight[n:], cell.U.weight
    s, logits, alphas = s0, [], []
    for y in y_prev:
        Ey = dec.embed_tokens.weight[y]
        c, alpha = contexts_fn(s)
        z = torch.sigmoid(W[:n] @ Ey + b[:n] + U_z @ s + C[:n] @ c)
        r = torch.sigmoid(W[n:2 * n] @ Ey + b[n:2 * n] + U_r @ s + C[n:2 * n] @ c)
        s_tilde = torch.tanh(W[2 * n:] @ Ey + b[2 * n:] + U @ (r * s) + C[2 * n:] @ c)
        s_new = (1 - z) * s + z * s_tilde
        s_out = s if use_previous else s_new
        t_tilde = dec.U_o.weight @ s_out + dec.U_o.bias + dec.V_o.weight @ Ey + dec.C_o.weight @ c
        t = torch.stack([torch.max(t_tilde[2 * k], t_tilde[2 * k + 1]) for k in range(len(t_tilde) // 2)])
        logits.append(dec.W_o.weight @ t + dec.W_o.bias)
        alphas.append(alpha)
        s = s_new
    return torch.stack(logits), alphas


def ref_attention(att, s_prev, h):
    """e_j = v_aᵀ tanh(W_a s_{i-1} + U_a h_j + b_a) over the real annotations h (len, 2n) only."""
    e = torch.stack([
        att.v_a.weight[0] @ torch.tanh(att.W_a.weight @ s_prev + att.U_a.weight @ h_j + att.U_a.bias) for h_j in h
    ])
    alpha = torch.exp(e) / torch.exp(e).sum()
    return (alpha.unsqueeze(1) * h).sum(0), alpha
