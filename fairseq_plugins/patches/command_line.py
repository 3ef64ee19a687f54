"""fairseq's command-line tools end a user's mistake with one line, not a traceback or 100 lines of usage.

- A :class:`~fairseq_plugins.errors.PluginError` (a wrong flag, an unreadable checkpoint, NaN/Inf
  in training) prints ``error: <message>``; every other exception keeps its traceback.
- A wrong flag of fairseq's own parsers (those with ``--user-dir``) prints ``<tool>: error: ...``
  without the usage (over 100 lines for fairseq-train); a value outside a flag's choices
  (``--arch rnnserch_tiny``) names the close matches.
- A data directory that does not exist ends the command line's parse, before fairseq creates
  ``--save-dir`` or reads anything.

A wrong ``--user-dir`` cannot be caught here: fairseq raises on it before importing the suite.
"""
import argparse
import difflib
import os
import sys

from fairseq import options, utils

from fairseq_plugins.errors import PluginError
from fairseq_plugins.patches._mechanism import Patch, Target

EXCEPTHOOK = Target(sys, "excepthook")
ERROR = Target(argparse.ArgumentParser, "error", "self, message")
CHECK_VALUE = Target(argparse.ArgumentParser, "_check_value", "self, action, value")
PARSE = Target(options, "parse_args_and_arch", "parser, input_args, parse_known, suppress_defaults, modify_parser")


def _excepthook(exc_type, exc, tb):
    if issubclass(exc_type, PluginError):
        print(f"error: {exc}", file=sys.stderr)
    else:
        EXCEPTHOOK(exc_type, exc, tb)


def _fairseqs(parser):
    """Whether ``parser`` is one of fairseq's (every one has --user-dir); other programs' keep argparse's ways."""
    return "--user-dir" in getattr(parser, "_option_string_actions", {})


def _error(self, message):
    if not _fairseqs(self):
        return ERROR(self, message)
    self.exit(2, f"{self.prog}: error: {message}\n")  # argparse's own line, without the usage above it


def _check_value(self, action, value):
    try:
        CHECK_VALUE(self, action, value)
    except argparse.ArgumentError:
        if not _fairseqs(self):
            raise
        choices = [str(c) for c in action.choices]
        close = difflib.get_close_matches(str(value), choices, n=3)
        hint = f"did you mean {', '.join(close)}?" if close else "none is close"
        flag = "/".join(action.option_strings) or action.dest
        raise argparse.ArgumentError(None, f"{flag} {value}: not one of its {len(choices)} choices; {hint}")


def _parse_args_and_arch(parser, input_args=None, parse_known=False, suppress_defaults=False, modify_parser=None):
    args = PARSE(parser, input_args, parse_known, suppress_defaults, modify_parser)
    if input_args is None:  # the tool's own command line (scripts and tests give theirs, data or not)
        for path in utils.split_paths(getattr(args, "data", None) or ""):
            if "://" not in path and not os.path.isdir(path):
                parser.exit(2, f"{parser.prog}: error: data directory {path}: no such folder "
                               "(fairseq-preprocess --destdir writes one)\n")
    return args


PATCH = Patch(__name__, {EXCEPTHOOK: _excepthook, ERROR: _error, CHECK_VALUE: _check_value,
                         PARSE: _parse_args_and_arch})
