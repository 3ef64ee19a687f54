"""fairseq-plugins: load with ``--user-dir fairseq_plugins`` (or ``import fairseq_plugins``).

Importing the package installs the suite's changes to fairseq (:mod:`fairseq_plugins.patches`:
weights-only checkpoint loading under every torch version, atomic checkpoint writes, no
dropped batches, NaN/Inf reported with the update's sentences, one-line errors) and then
registers every model, criterion, LR scheduler and task of the suite with fairseq's registries.

The one exception: the console scripts of the tools that need no model start through
:mod:`fairseq_plugins_tools`, and while it is loaded nothing is installed, so they import
neither torch nor fairseq.
"""
import sys

if "fairseq_plugins_tools" not in sys.modules:
    from fairseq_plugins import patches

    patches.install_all()

    from fairseq_plugins import criterions, lr_schedulers, models, tasks  # noqa: F401  (after the patches)

__version__ = "0.1.0"
