"""Linear layers for decoding on a CPU: ``y = x Wᵀ + b`` with W laid out once for oneDNN's kernels
(float32, :func:`prepack_linear_layers_`), or with int8 weights and int8 products
(:func:`quantize_linear_layers_`).

PyTorch's ``F.linear`` on a float32 CPU tensor calls MKL's sgemm, which on the AMD EPYC of
docs/BENCHMARKS.md runs at the AVX2 peak; oneDNN's linear on a weight reordered once into its
blocked layout (what inductor's weight prepacking does) ran twice as fast there. Decoding calls
each linear layer once per step on a few hundred rows, so the layout is paid once and the speed
every step.
"""
import platform
import warnings
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def prepacking_available() -> bool:
    """An x86 CPU (where these kernels were measured and tested) and a torch built with oneDNN."""
    return platform.machine().lower() in ("x86_64", "amd64") and torch.backends.mkldnn.is_available()


class PrepackedLinear(nn.Linear):
    """An ``nn.Linear`` (same parameters, same state_dict) that, without autograd and on float32
    CPU inputs, multiplies by a oneDNN copy of its weight. The copy is made at the first such call
    and again whenever the weight changed (``load_state_dict``, an optimizer step, a new tensor);
    anything else (training, half precision, a GPU) runs ``F.linear``."""

    @classmethod
    def sharing(cls, linear: nn.Linear) -> "PrepackedLinear":
        """A PrepackedLinear holding ``linear``'s own parameters (ties such as shared embeddings stay)."""
        layer = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        layer.weight, layer.bias = linear.weight, linear.bias
        return layer

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._packed = None  # (what it was made from, oneDNN weight), replaced in one assignment

    def forward(self, x: Tensor) -> Tensor:
        w = self.weight
        if torch.is_grad_enabled() or x.device.type != "cpu" or x.dtype != torch.float32 or w.dtype != x.dtype:
            return F.linear(x, w, self.bias)
        made_from = (w.data_ptr(), w._version, tuple(w.shape))
        packed = self._packed
        if packed is None or packed[0] != made_from:
            packed = (made_from, torch.ops.mkldnn._reorder_linear_weight(w.detach(), None))
            self._packed = packed
        bias = None if self.bias is None else self.bias.detach()
        return torch.ops.mkldnn._linear_pointwise(x, packed[1], bias, "none", [], "")

    def __getstate__(self):
        # a oneDNN tensor cannot be copied or pickled: copies make their own at their first call
        return {**super().__getstate__(), "_packed": None}


def prepack_linear_layers_(module: nn.Module) -> int:
    """Replaces every ``nn.Linear`` inside ``module`` by a :class:`PrepackedLinear` sharing its
    parameters; returns how many (0 where :func:`prepacking_available` is not: nothing changes)."""
    if not prepacking_available():
        return 0
    replaced = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, PrepackedLinear.sharing(child))
                replaced += 1
    return replaced


def int8_engine(flags: Sequence[str]) -> str:
    """PyTorch's quantized engine for the int8 layers on a CPU with ``flags``
    (:func:`fairseq_plugins.hardware.cpu_flags`): oneDNN where AMX multiplies int8 tiles, PyTorch's
    default (fbgemm's VNNI kernels on x86) elsewhere. On a Xeon with AMX, oneDNN's AMX kernels ran
    the decoders' products twice as fast as fbgemm and decoded 10-16% faster; on an AMD EPYC with
    VNNI and no AMX oneDNN decoded 5% slower (docs/DECODING.md; the runs: reports/benchmarks/README.md)."""
    if "amx_int8" in flags and "onednn" in torch.backends.quantized.supported_engines:
        return "onednn"
    return torch.backends.quantized.engine


def quantize_linear_layers_(module: nn.Module, engine: str) -> int:
    """Replaces every ``nn.Linear`` inside ``module`` that has more than one output by PyTorch's
    dynamically quantized linear layer (int8 weights, one scale per output channel; each call's
    input rounded to 8 bits with its own range; int8 × int8 products summed in int32: the VNNI and
    AMX instructions' work), its weights packed for the quantized ``engine`` (:func:`int8_engine`),
    whose kernels it then runs whatever the global engine; returns how many. A one-output layer
    (RNNsearch's ``v_a``) is a vector the model reads, not a product worth quantizing."""
    names = [name for name, child in module.named_modules() if type(child) is nn.Linear and child.out_features > 1]
    with warnings.catch_warnings():  # deprecated for torchao, but the pinned torch's way to fbgemm's int8 kernels
        warnings.filterwarnings("ignore", message=r"torch\.(ao\.quantization|quantize_per_tensor)")
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        if names:
            previous = torch.backends.quantized.engine
            torch.backends.quantized.engine = engine  # what packs the weights (a global in torch)
            try:
                quantize_dynamic(module, dict.fromkeys(names, per_channel_dynamic_qconfig), dtype=torch.qint8,
                                 inplace=True)
            finally:
                torch.backends.quantized.engine = previous
    return len(names)
