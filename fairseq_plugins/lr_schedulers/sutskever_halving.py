"""Sutskever et al. (2014) learning-rate schedule: ``--lr`` for the first epochs, then halved
every half epoch ("after 5 epochs, we begun halving the learning rate every half epoch").

With U updates per epoch, A = ``--halve-after-epochs`` and H = ``--halve-every-epochs``::

    lr(u) = lr                                    if u < A·U
    lr(u) = lr · 0.5 ** (floor((u - A·U) / (H·U)) + 1)   otherwise

so the paper's 7.5 epochs (A = 5, H = 0.5) halve at epochs 5, 5.5, 6, 6.5 and 7.

U is ``--updates-per-epoch`` when given; otherwise it is measured as the number of updates
in the first epoch (read when the second epoch begins; fairseq's epochs have the same
number of batches every epoch) and saved with the checkpoint.
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
class SutskeverHalvingConfig(FairseqDataclass):
    halve_after_epochs: float = field(
        default=5.0, metadata={"help": "keep --lr fixed for this many epochs, then halve it (paper: 5)"}
    )
    halve_every_epochs: float = field(
        default=0.5, metadata={"help": "after that, halve the lr every this many epochs (paper: 0.5)"}
    )
    updates_per_epoch: int = field(
        default=0,
        metadata={"help": "updates per epoch; 0 = measure it from the first epoch "
                          "(then --halve-after-epochs must be at least 1)"},
    )
    lr: List[float] = II("optimization.lr")


@register_lr_scheduler("sutskever_halving", dataclass=SutskeverHalvingConfig)
class SutskeverHalvingSchedule(FairseqLRScheduler):
    """Fixed lr for ``--halve-after-epochs`` epochs, then halved every ``--halve-every-epochs``."""

    def __init__(self, cfg: SutskeverHalvingConfig, optimizer):
        super().__init__(cfg, optimizer)
        self.base_lr = single_lr(cfg.lr, "sutskever_halving")
        if cfg.halve_every_epochs <= 0:
            raise ConfigError(f"--halve-every-epochs must be positive, got {cfg.halve_every_epochs}")
        if cfg.updates_per_epoch < 0:
            raise ConfigError(f"--updates-per-epoch must be >= 0, got {cfg.updates_per_epoch}")
        if cfg.updates_per_epoch == 0 and cfg.halve_after_epochs < 1:
            raise ConfigError(
                f"--halve-after-epochs {cfg.halve_after_epochs} < 1 needs --updates-per-epoch "
                "(it is otherwise measured from the first epoch)"
            )
        self.updates_per_epoch: Optional[float] = cfg.updates_per_epoch or None
        self.epoch_began: Optional[int] = None
        self.optimizer.set_lr(self.base_lr)

    def lr_at(self, num_updates: int) -> float:
        """The schedule's formula (module docstring)."""
        if self.updates_per_epoch is None:
            return self.base_lr
        start = self.cfg.halve_after_epochs * self.updates_per_epoch
        if num_updates < start:
            return self.base_lr
        halvings = math.floor((num_updates - start) / (self.cfg.halve_every_epochs * self.updates_per_epoch)) + 1
        return self.base_lr * 0.5 ** halvings

    def state_dict(self):
        return {"best": self.best, "updates_per_epoch": self.updates_per_epoch}

    def load_state_dict(self, state_dict):
        self.best = state_dict.get("best")
        if self.cfg.updates_per_epoch == 0:
            self.updates_per_epoch = state_dict.get("updates_per_epoch")

    def step_begin_epoch(self, epoch):
        self.epoch_began = epoch
        return self.optimizer.get_lr()

    def step_update(self, num_updates):
        # fairseq calls step_update(num_updates) right after step_begin_epoch(epoch)
        if self.epoch_began is not None and self.epoch_began >= 2 and self.updates_per_epoch is None:
            self.updates_per_epoch = num_updates / (self.epoch_began - 1)
        self.epoch_began = None
        self.optimizer.set_lr(self.lr_at(num_updates))
        return self.optimizer.get_lr()
