"""Warm-up then inverse square root decay: eq. 3 of Vaswani et al. (2017).

    lr(t) = scale · d_model^-0.5 · min(t^-0.5, t · warmup^-1.5)          (--model-dim given)
          = peak · min(t / warmup, sqrt(warmup / t)),  peak = scale · (d_model · warmup)^-0.5

so the paper's form is the familiar peak form with ``peak`` derived from d_model. Without
``--model-dim``, ``--lr`` is the peak itself (fairseq users' ``--lr P --warmup-updates W``).

t is the paper's 1-based ``step_num``: the update about to be made is update number
``num_updates + 1``, so the first update already uses a non-zero rate. The rate is a pure
function of the update count, so it continues exactly after a checkpoint resume.
"""
import math
from dataclasses import dataclass, field
from typing import List, Optional

from fairseq.dataclass import FairseqDataclass
from fairseq.optim.lr_scheduler import FairseqLRScheduler, register_lr_scheduler
from omegaconf import II

from fairseq_plugins.errors import ConfigError
from fairseq_plugins.lr_schedulers._single_lr import single_lr


@dataclass
class InverseSqrtWarmupConfig(FairseqDataclass):
    warmup_updates: int = field(default=4000, metadata={"help": "warm-up steps (paper: 4000)"})
    model_dim: Optional[int] = field(
        default=None,
        metadata={"help": "d_model of eq. 3; when given, --lr is the scale factor of the paper's formula "
                          "(1.0 = the paper), otherwise --lr is the peak learning rate"},
    )
    lr: List[float] = II("optimization.lr")


@register_lr_scheduler("inverse_sqrt_warmup", dataclass=InverseSqrtWarmupConfig)
class InverseSqrtWarmupSchedule(FairseqLRScheduler):
    def __init__(self, cfg: InverseSqrtWarmupConfig, optimizer):
        super().__init__(cfg, optimizer)
        scale = single_lr(cfg.lr, "inverse_sqrt_warmup")
        if cfg.warmup_updates < 1:
            raise ConfigError(f"--warmup-updates {cfg.warmup_updates}: must be at least 1")
        if cfg.model_dim is not None and cfg.model_dim < 1:
            raise ConfigError(f"--model-dim {cfg.model_dim}: must be a positive model width")
        self.warmup = cfg.warmup_updates
        self.peak = scale if cfg.model_dim is None else scale / math.sqrt(cfg.model_dim * self.warmup)
        self.step_update(0)

    def lr_at(self, step):
        """Eq. 3 at the 1-based step ``step``."""
        return self.peak * min(step / self.warmup, math.sqrt(self.warmup / step))

    def step(self, epoch, val_loss=None):
        super().step(epoch, val_loss)
        return self.optimizer.get_lr()

    def step_update(self, num_updates):
        lr = self.lr_at(num_updates + 1)
        self.optimizer.set_lr(lr)
        return lr
