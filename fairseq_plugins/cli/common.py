"""What the command-line tools share: one-line argparse errors and the analysis tools' flags.

Bad input raises :class:`~fairseq_plugins.errors.ConfigError`, which :func:`run` turns into one
``prog: error: ...`` line and exit code 2.
"""
import argparse
from typing import Optional, Sequence

from fairseq_plugins.errors import ConfigError


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but errors are one line (no usage block) and exit with code 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def run(parser: ArgumentParser, body, argv: Optional[Sequence[str]] = None):
    """Parse ``argv`` and call ``body(args)``; a :class:`ConfigError` becomes a one-line error."""
    args = parser.parse_args(argv)
    try:
        return body(args)
    except ConfigError as e:
        parser.error(str(e))


def add_system_args(parser: argparse.ArgumentParser, src_help: Optional[str]):
    """--gen/--hyp/--ref, and --src (with ``src_help``) for commands that read sources."""
    group = parser.add_argument_group("input: fairseq-generate output, or plain text files")
    group.add_argument("--gen", action="append", default=[], metavar="[NAME=]FILE",
                       help="fairseq-generate output of one system (repeat for several systems); "
                       "D- lines are scored against T- lines, S- lines give the sources")
    group.add_argument("--hyp", action="append", default=[], metavar="[NAME=]FILE",
                       help="plain hypothesis file, one sentence per line (repeat for several systems)")
    group.add_argument("--ref", metavar="FILE", help="plain reference file (with --hyp)")
    if src_help is not None:
        group.add_argument("--src", metavar="FILE", help=src_help)


def add_out_arg(parser: argparse.ArgumentParser, default: str):
    parser.add_argument("--out", default=default, metavar="PREFIX",
                        help="write PREFIX.md (markdown table) and PREFIX.png (figure); "
                        f"default {default}")
