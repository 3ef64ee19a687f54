"""What the recurrent models share: build-time checks.

This module registers nothing (``models/__init__`` imports every module of the folder).
"""
from fairseq_plugins.errors import ConfigError

def check_positive(args, flags) -> None:
    """ConfigError naming the first of ``flags`` (attribute names) that is not a positive integer."""
    for flag in flags:
        value = getattr(args, flag, 1)
        if value < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be a positive integer, got {value}")
