"""What the recurrent models share: batch-first encoder outputs and their build-time checks.

This module registers nothing (``models/__init__`` imports every module of the folder).
"""
from typing import Dict, List

from torch import Tensor

from fairseq_plugins.errors import ConfigError

EncoderOut = Dict[str, List[Tensor]]


def reorder_batch_first(encoder_out: EncoderOut, new_order: Tensor) -> EncoderOut:
    """``reorder_encoder_out`` for encoders whose outputs are all batch-first."""
    return {k: [t.index_select(0, new_order) for t in v] for k, v in encoder_out.items()}


def check_positive(args, flags) -> None:
    """ConfigError naming the first of ``flags`` (attribute names) that is not a positive integer."""
    for flag in flags:
        value = getattr(args, flag, 1)
        if value < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be a positive integer, got {value}")
