"""``fairseq-train --cpu --fp16`` (or ``--memory-efficient-fp16``) is refused up front.

fairseq accepts the flags on CPU, trains in fp16 until the loss scaler's first overflow, then
dies with "Torch not compiled with CUDA enabled". The refusal is checked where
``fairseq-train`` starts its workers (``distributed_utils.call_main``), so code that drives
fairseq's ``Trainer`` directly (the suite's in-process fp16 tests) is unaffected.
"""
import torch
from fairseq.distributed import utils as distributed_utils

from fairseq_plugins.errors import ConfigError
from fairseq_plugins.patches._mechanism import Patch, Target

CALL_MAIN = Target(distributed_utils, "call_main", "cfg, main, **kwargs")


def call_main(cfg, main, **kwargs):
    if cfg.common.cpu or not torch.cuda.is_available():
        for flag in ("memory_efficient_fp16", "fp16"):  # the first implies the second
            if cfg.common.get(flag):
                raise ConfigError(f"--{flag.replace('_', '-')}: fairseq's fp16 training needs a CUDA GPU; on CPU "
                                  "train in fp32, or in bf16 with --criterion label_smoothed_xent --autocast-bf16")
    return CALL_MAIN(cfg, main, **kwargs)


# Refused before cpu_launch's call_main spawns workers.
PATCH = Patch(__name__, {CALL_MAIN: call_main}, requires=["cpu_launch"])
