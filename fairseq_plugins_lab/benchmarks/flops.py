"""FLOP formulas added to ``torch.utils.flop_counter`` for the benchmark's model FLOP/s.

Matmul/attention FLOPs of forward+backward are counted by ``FlopCounterMode``; torch counts
neither CPU fused attention nor fused RNN kernels, and counts the attention backward kernels
at their own (recomputing) cost: :data:`EXTRA_FLOP_FORMULAS` adds those at model FLOPs.
"""
import importlib
import math

import torch
from torch.utils.flop_counter import _FlopCounterMode, sdpa_flop_count

_scan = importlib.import_module("torch._higher_order_ops.scan")  # the module (its package exports a function of that name)

def _rnn_flops(input_shape, weight_shapes) -> int:
    """Fused RNN kernels: every weight matrix is applied once to every token."""
    tokens = math.prod(input_shape[:-1])  # [T, B, I], or packed [Σ batch_sizes, I]
    return 2 * tokens * sum(w[0] * w[1] for w in weight_shapes if len(w) == 2)


def _sdpa_backward_flops(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    """Model FLOPs: twice the forward's, as for the explicit matmuls (fused kernels that
    recompute QKᵀ do more work, which torch's own formulas count)."""
    return 2 * sdpa_flop_count(query, key, value)


_aten = torch.ops.aten
# Added to torch's FlopCounterMode: CPU fused attention and fused RNNs (uncounted otherwise), and
# the attention backward kernels at model FLOPs, so the fused and explicit paths count the same.
EXTRA_FLOP_FORMULAS = {
    _aten._scaled_dot_product_flash_attention_for_cpu:
        lambda q, k, v, *a, out_shape=None, **kw: sdpa_flop_count(q, k, v),
    **{op: _sdpa_backward_flops for op in (
        _aten._scaled_dot_product_flash_attention_for_cpu_backward,
        _aten._scaled_dot_product_flash_attention_backward,
        _aten._scaled_dot_product_efficient_attention_backward,
        _aten._scaled_dot_product_cudnn_attention_backward)},
    _aten.mkldnn_rnn_layer: lambda x, w_ih, w_hh, *a, out_shape=None, **kw: _rnn_flops(x, [w_ih, w_hh]),
    _aten.mkldnn_rnn_layer_backward:
        lambda x, w_ih, w_hh, *a, out_shape=None, **kw: 2 * _rnn_flops(x, [w_ih, w_hh]),
    _aten._cudnn_rnn: lambda x, weights, *a, out_shape=None, **kw: _rnn_flops(x, weights),
    _aten._cudnn_rnn_backward: lambda x, weights, *a, out_shape=None, **kw: 2 * _rnn_flops(x, weights),
}


def count_scan_steps() -> None:
    """Lets ``FlopCounterMode`` count the matmuls inside ``scan`` (the recurrent encoders' path
    whenever autograd is off: generation), which it otherwise refuses: the scan runs step by
    step under the counter, as torch's own eager scan does. Idempotent."""
    if _FlopCounterMode not in _scan.scan_op.python_key_table:
        @_scan.scan_op.py_impl(_FlopCounterMode)
        def _counted(mode, combine_fn, init, xs, additional_inputs):
            with mode:
                return _scan.generic_scan(combine_fn, init, xs, additional_inputs=additional_inputs)
