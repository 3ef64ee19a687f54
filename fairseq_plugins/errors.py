"""The suite's errors: each message is one line naming the flag, file or value at fault.

fairseq's command-line tools print them without a traceback (see
:mod:`fairseq_plugins.patches.command_line`), so ``fairseq-train --user-dir fairseq_plugins ...``
ends with ``error: <message>``.
"""


class PluginError(Exception):
    """Base class: the message alone tells the user what to fix."""


class ConfigError(PluginError, ValueError):
    """A flag value the suite cannot build or run with."""


class CheckpointError(PluginError, RuntimeError):
    """A file that is not a loadable fairseq checkpoint."""


class NumericalError(PluginError, FloatingPointError):
    """Training produced NaN/Inf: names the update, its sentences and where the values went bad."""
