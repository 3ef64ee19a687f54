"""fairseq-plugins-benchmark-serve MODEL --sentences FILE [--clients 32] [--requests 2000] [-- SERVER FLAGS]

What is measured and how: :mod:`fairseq_plugins.benchmarks.serve`.
"""
import tempfile

from fairseq_plugins.benchmarks.serve import benchmark
from fairseq_plugins.cli.common import ArgumentParser, cli_main
from fairseq_plugins.errors import ConfigError


def get_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="fairseq-plugins-benchmark-serve",
        description="Throughput and p50/p95 latency of fairseq-plugins-serve under concurrent clients on "
                    "127.0.0.1, batched vs --max-batch-tokens 1.")
    parser.add_argument("model", help="MODEL of fairseq-plugins-serve (checkpoint or CTranslate2 folder)")
    parser.add_argument("--sentences", required=True, help="raw source sentences, one per line (cycled)")
    parser.add_argument("--clients", type=int, default=32, help="concurrent clients (default 32)")
    parser.add_argument("--requests", type=int, default=2000, help="requests in all, one sentence each (default 2000)")
    parser.add_argument("--beam", type=int, default=4, help="beam of every request (default 4)")
    parser.add_argument("--out", help="also write the markdown table to this file")
    parser.add_argument("server_flags", nargs="*", metavar="SERVER FLAGS",
                        help="after --: flags of the batched server, e.g. -- --max-delay-ms 10 --threads 2")
    return parser


def main(argv=None):
    def body(args):
        with open(args.sentences, encoding="utf-8") as f:
            sentences = [line.strip() for line in f if line.strip()]
        if not sentences:
            raise ConfigError(f"--sentences {args.sentences} holds no sentence")
        if args.clients < 1 or args.requests < args.clients:
            raise ConfigError(f"--clients {args.clients} must be >= 1 and <= --requests {args.requests}")
        with tempfile.TemporaryDirectory() as logs:
            table = benchmark(args.model, sentences, args.clients, args.requests, args.beam, args.server_flags, logs)
        print(table)
        if args.out:
            with open(args.out, "w", encoding="utf-8") as f:
                f.write(table)

    cli_main(get_parser, body, argv)


if __name__ == "__main__":
    main()
