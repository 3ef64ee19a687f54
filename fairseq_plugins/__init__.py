"""fairseq-plugins: load with ``--user-dir fairseq_plugins`` (or ``import fairseq_plugins``).

Importing the package registers every model, criterion, LR scheduler and task of the
suite with fairseq's registries, and lets fairseq load its own checkpoints under
torch >= 2.6 without turning off ``weights_only`` (see :mod:`fairseq_plugins.compat`),
makes every checkpoint write atomic (see :mod:`fairseq_plugins.atomic_checkpoints`), and
ends training on NaN/Inf with one line naming the update and its sentences, never saving
non-finite parameters (see :mod:`fairseq_plugins.numerical_faults`).
"""
from fairseq_plugins import compat  # noqa: F401  (first: checkpoint loading)
from fairseq_plugins import atomic_checkpoints  # noqa: F401  (atomic checkpoint writes)
from fairseq_plugins import numerical_faults  # noqa: F401  (NaN/Inf reported with the batch's sentence ids)
from fairseq_plugins import criterions, lr_schedulers, models, tasks  # noqa: F401

__version__ = "0.1.0"
