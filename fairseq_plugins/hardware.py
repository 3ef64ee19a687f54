"""What the CPU can do, as the benchmarks and the int8 exports report it.

int8 only pays where the CPU multiplies int8 pairs and sums them in 32 bits in one instruction
(AVX512-VNNI, AVX-VNNI, AMX): without them int8 kernels widen to 16 bits (AVX2's
``vpmaddubsw``) and decode about as fast as float32 (docs/ONNX.md), so float32 stays the default.
"""
import platform
from typing import List, Optional

import torch

# the /proc/cpuinfo flags that decide matrix-product speed, in the order printed
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8")
INT8_DOT_PRODUCTS = ("avx512_vnni", "avx_vnni", "amx_int8")


def _cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


def cpu_model(cpuinfo: Optional[str] = None) -> str:
    for line in (_cpuinfo() if cpuinfo is None else cpuinfo).splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def cpu_flags(cpuinfo: Optional[str] = None) -> List[str]:
    """The ISA_FLAGS of the first processor in /proc/cpuinfo (empty where it cannot be read)."""
    for line in (_cpuinfo() if cpuinfo is None else cpuinfo).splitlines():
        if line.startswith("flags"):
            present = set(line.split(":", 1)[1].split())
            return [flag for flag in ISA_FLAGS if flag in present]
    return []


def native_bf16(device_type: str) -> bool:
    """Whether ``device_type`` ("cpu" or "cuda") multiplies bf16 in hardware: elsewhere bf16 is
    emulated, many times slower than fp32 (a 2048² matmul: minutes on an AVX2 CPU)."""
    if device_type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    return torch.ops.mkldnn._is_mkldnn_bf16_supported()  # oneDNN: AVX-512 (BF16/AMX) or Arm BF16


def int8_note(flags: List[str]) -> str:
    """One line: whether int8 can beat float32 on a CPU with ``flags``."""
    found = [flag for flag in INT8_DOT_PRODUCTS if flag in flags]
    if found:
        return f"int8 dot products: {', '.join(found)}"
    return ("no int8 dot products on this CPU (none of AVX512-VNNI, AVX-VNNI, AMX): int8 decodes about as fast "
            "as float32 here, float32 stays the default")


def describe_cpu(cpuinfo: Optional[str] = None) -> str:
    flags = cpu_flags(cpuinfo)
    return f"{cpu_model(cpuinfo)} (flags: {' '.join(flags) or 'unknown'}; {int8_note(flags)})"
