"""The suite's errors end fairseq's command-line tools with one line, not a traceback.

fairseq's tools (``fairseq-train``, ``fairseq-generate``, ...) let exceptions reach the
interpreter. For a :class:`~fairseq_plugins.errors.PluginError` -- a wrong flag, an unreadable
checkpoint, NaN/Inf in training -- the message alone tells the user what to fix, so the
process prints ``error: <message>`` instead; every other exception keeps its traceback.
"""
import sys

from fairseq_plugins.errors import PluginError


def _excepthook(exc_type, exc, tb, _previous=sys.excepthook):
    if issubclass(exc_type, PluginError):
        print(f"error: {exc}", file=sys.stderr)
    else:
        _previous(exc_type, exc, tb)


def install():
    sys.excepthook = _excepthook
