"""``fairseq-plugins-serve``'s body: load the model, then serve it with uvicorn until SIGTERM/SIGINT.

On SIGTERM uvicorn stops accepting connections, answers the requests in flight (up to
``--graceful-timeout`` seconds), shuts the batcher down and the process exits with 0.
"""
import contextlib
import logging
from argparse import Namespace

import uvicorn

from fairseq_plugins.errors import ConfigError
from fairseq_plugins.serve.app import Limits, build_app
from fairseq_plugins.serve.backends import load_backend
from fairseq_plugins.serve.batching import Batcher

logger = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):
        with super().capture_signals():
            try:
                yield
            finally:
                # uvicorn re-raises the signal it stopped on once it has shut down, so the process
                # would die of SIGTERM; a requested stop after a clean shutdown is a success.
                self._captured_signals.clear()


def check(args: Namespace) -> None:
    for flag in ("port", "max_batch_tokens", "workers", "threads", "max_chars", "max_source_tokens",
                 "max_sentences", "max_beam"):
        low = 0 if flag == "port" else 1
        if getattr(args, flag) < low:
            raise ConfigError(f"--{flag.replace('_', '-')} must be >= {low}, got {getattr(args, flag)}")
    if args.max_delay_ms < 0:
        raise ConfigError(f"--max-delay-ms must be >= 0, got {args.max_delay_ms}")


def serve(args: Namespace) -> None:
    check(args)
    backend = load_backend(args.model, args.data, args, args.workers, args.threads)
    limits = Limits(args.max_chars, args.max_source_tokens, args.max_sentences, args.max_beam)
    batcher = Batcher(backend, args.max_batch_tokens, args.max_delay_ms, args.workers)
    info = {
        "model": args.model, "backend": backend.kind, "family": backend.family, "arch": backend.arch,
        "compute_type": getattr(backend, "compute_type", "float32"),
        "vocabulary": backend.vocabulary, "alignment": backend.has_attention, "preprocessing": backend.text.description,
        "options": {"beam": 4, "n_best": 1, "alignment": False},
        "batching": {"max_batch_tokens": args.max_batch_tokens, "max_delay_ms": args.max_delay_ms,
                     "workers": args.workers, "threads": args.threads},
    }
    app = build_app(backend, batcher, limits, info)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=args.graceful_timeout, access_log=False)
    logger.info("%s (%s, %s) on http://%s:%d", args.model, backend.family, backend.kind, args.host, args.port)
    _Server(config).run()
