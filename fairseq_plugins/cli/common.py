"""What every command-line tool shares: :func:`cli_main` and the analysis tools' flags.

A tool is ``get_parser()`` (argparse) and a body ``body(args)`` from the library; :func:`cli_main`
parses, sets up logging and runs the body. A wrong flag or file -- argparse's own errors and
every :class:`~fairseq_plugins.errors.PluginError` the body raises -- ends the tool with one
line, ``prog: error: <message>``, and exit code 2.
"""
import argparse
import logging
import sys
from typing import Callable, Optional, Sequence

from fairseq_plugins.errors import PluginError


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but errors are one line (no usage block) and exit with code 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def cli_main(get_parser: Callable[[], ArgumentParser], body, argv: Optional[Sequence[str]] = None):
    """Parse ``argv`` with ``get_parser()``, then return ``body(args)``; a PluginError is one line, exit 2.

    Log records go to stderr as ``name: message`` at INFO, unless logging is configured already
    (fairseq's own tools configure it).
    """
    parser = get_parser()
    args = parser.parse_args(argv)
    # the command as run, for the reports that quote it: main(argv) called from Python has no sys.argv of its own;
    # a sub-command's prog is two words
    args.invocation = [*parser.prog.split(" "), *(sys.argv[1:] if argv is None else map(str, argv))]
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stderr)
    try:
        return body(args)
    except PluginError as e:
        parser.error(str(e))


def add_data_args(parser: argparse.ArgumentParser, data_help: str):
    """--data (fairseq-preprocess output) and the languages to read from it (the benchmarks)."""
    parser.add_argument("--data", help=data_help)
    parser.add_argument("--source-lang", help="source language of --data (default: inferred)")
    parser.add_argument("--target-lang", help="target language of --data (default: inferred)")


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
