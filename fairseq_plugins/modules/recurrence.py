"""A recurrence over time as one ``scan``: the recurrent encoders run it whenever autograd is off,
so the program ``torch.export`` traces (for any length) is the code ``fairseq-generate`` runs.
Training keeps a Python loop over the same step: scan's backward is several times slower.
"""
from typing import Callable, List, Tuple

from torch import Tensor
from torch._higher_order_ops.scan import scan_op


def scan_over_time(step: Callable[..., Tuple[Tensor, Tensor]], carry: Tensor, xs: List[Tensor],
                   weights: List[Tensor]) -> Tuple[Tensor, Tensor]:
    """``carry_j, out_j = step(carry_{j-1}, *xs_j, *weights)`` for every j of dim 0 of ``xs``.

    ``step`` must be a function of its arguments only (parameters come in ``weights``): ``scan``
    differentiates and exports with respect to its inputs. Returns the final carry and every
    ``out_j`` stacked on dim 0.
    """

    def body(carry: Tensor, *inputs: Tensor) -> Tuple[Tensor, Tensor]:
        carry, out = step(carry, *inputs)
        return carry, out.clone()  # scan's outputs may not alias its carry

    final, outs = scan_op(body, [carry], list(xs), tuple(weights))
    return final, outs


def final_carry(step: Callable[..., Tensor], carry: Tensor, xs: List[Tensor], weights: List[Tensor]) -> Tensor:
    """The last ``carry_j = step(carry_{j-1}, *xs_j, *weights)`` over dim 0 of ``xs``, for an
    encoder that keeps only its final state: no per-step output is copied out (as in
    :func:`scan_over_time`, ``step`` is a function of its arguments only)."""
    (final,) = scan_op(lambda carry, *inputs: (step(carry, *inputs),), [carry], list(xs), tuple(weights))
    return final
