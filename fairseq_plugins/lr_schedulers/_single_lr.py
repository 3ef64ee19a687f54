"""What the suite's schedules share: one --lr, not fairseq's per-epoch list."""
from typing import Sequence

from fairseq_plugins.errors import ConfigError


def single_lr(lr: Sequence[float], schedule: str) -> float:
    """The one value of fairseq's --lr list (a per-epoch list, or empty with --lr ''), or one line."""
    if len(lr) != 1:
        raise ConfigError(f"--lr {list(lr)}: {schedule} takes exactly one value, not a per-epoch list")
    return lr[0]
