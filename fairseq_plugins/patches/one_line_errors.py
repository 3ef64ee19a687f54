"""The suite's errors end fairseq's command-line tools with one line, not a traceback.

fairseq's tools (``fairseq-train``, ``fairseq-generate``, ...) let exceptions reach the
interpreter. For a :class:`~fairseq_plugins.errors.PluginError` -- a wrong flag, an unreadable
checkpoint, NaN/Inf in training -- the message alone tells the user what to fix, so the
process prints ``error: <message>`` instead; every other exception keeps its traceback.
"""
import sys

from fairseq_plugins.errors import PluginError
from fairseq_plugins.patches._mechanism import Patch, Target

EXCEPTHOOK = Target(sys, "excepthook")


def _excepthook(exc_type, exc, tb):
    if issubclass(exc_type, PluginError):
        print(f"error: {exc}", file=sys.stderr)
    else:
        EXCEPTHOOK(exc_type, exc, tb)


PATCH = Patch(__name__, {EXCEPTHOOK: _excepthook})
