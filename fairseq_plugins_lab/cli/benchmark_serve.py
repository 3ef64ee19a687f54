"""``fairseq-plugins-benchmark serve``: the server under concurrent clients, batched vs not.

    fairseq-plugins-benchmark serve MODEL --sentences FILE [--clients 32] [--requests 2000] [-- SERVER FLAGS]

Also installed as ``fairseq-plugins-benchmark-serve``, its name before sub-commands.
What is measured and how: :mod:`fairseq_plugins_lab.benchmarks.serve`.
"""
import sys
import tempfile

from fairseq_plugins.cli import serve
from fairseq_plugins.cli.common import ArgumentParser, cli_main
from fairseq_plugins.errors import ConfigError
from fairseq_plugins_lab.benchmarks.serve import benchmark

PROG = "fairseq-plugins-benchmark-serve"  # run alone, under its old name


class _Parser(ArgumentParser):
    """Everything after the first ``--`` is the server's: argparse would give a ``nargs="*"``
    positional its (empty) value with MODEL and refuse the flags after ``--`` as unrecognized."""

    def parse_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        split = args.index("--") if "--" in args else len(args)
        parsed = super().parse_args(args[:split], namespace)
        parsed.server_flags = args[split + 1:]
        return parsed


class _ServerFlags(ArgumentParser):
    """fairseq-plugins-serve's parser, raising instead of exiting: the server flags are checked here."""

    def error(self, message):
        raise ConfigError(f"server flag: {message}")


def get_parser(prog: str = PROG) -> ArgumentParser:
    parser = _Parser(
        prog=prog, usage=f"{prog} [-h] MODEL --sentences FILE [--clients N] [--requests N] [--beam N] [--out FILE] "
                         "[-- SERVER FLAGS ...]",
        description="Throughput and p50/p95 latency of fairseq-plugins-serve under concurrent clients on "
                    "127.0.0.1, batched vs --max-batch-tokens 1.",
        epilog="SERVER FLAGS (after --): flags of fairseq-plugins-serve for the batched server, "
               "e.g. -- --max-delay-ms 10 --threads 2")
    parser.add_argument("model", metavar="MODEL",
                        help="MODEL of fairseq-plugins-serve (checkpoint or CTranslate2 folder)")
    parser.add_argument("--sentences", required=True, metavar="FILE",
                        help="raw source sentences, one per line (cycled)")
    parser.add_argument("--clients", type=int, default=32, metavar="N", help="concurrent clients (default 32)")
    parser.add_argument("--requests", type=int, default=2000, metavar="N",
                        help="requests in all, one sentence each (default 2000)")
    parser.add_argument("--beam", type=int, default=4, metavar="N", help="beam of every request (default 4)")
    parser.add_argument("--out", metavar="FILE", help="also write the markdown table to this file")
    return parser


def check_server_flags(model, flags):
    """Refuse a wrong server flag in one line now, not as a server that fails to start."""
    server = serve.get_parser()
    checker = _ServerFlags(prog=server.prog, add_help=False, parents=[server], conflict_handler="resolve")
    for flag in ("--host", "--port"):
        if flag in flags:
            raise ConfigError(f"server flag {flag}: the benchmark chooses it (127.0.0.1, a free port)")
    checker.parse_args([model, *flags])


def main(argv=None, prog: str = PROG):
    def body(args):
        with open(args.sentences, encoding="utf-8") as f:
            sentences = [line.strip() for line in f if line.strip()]
        if not sentences:
            raise ConfigError(f"--sentences {args.sentences} holds no sentence")
        if args.clients < 1 or args.requests < args.clients:
            raise ConfigError(f"--clients {args.clients} must be >= 1 and <= --requests {args.requests}")
        check_server_flags(args.model, args.server_flags)
        with tempfile.TemporaryDirectory() as logs:
            table = benchmark(args.model, sentences, args.clients, args.requests, args.beam, args.server_flags, logs)
        print(table)
        if args.out:
            with open(args.out, "w", encoding="utf-8") as f:
                f.write(table)

    cli_main(lambda: get_parser(prog), body, argv)


if __name__ == "__main__":
    main()
