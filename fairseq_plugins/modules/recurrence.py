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
