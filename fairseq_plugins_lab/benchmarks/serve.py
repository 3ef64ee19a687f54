"""``fairseq-plugins-serve`` under load: concurrent clients on 127.0.0.1, batched vs unbatched.

:class:`ServerProcess` starts the server in its own process and waits for ``/health``;
:func:`run_load` sends requests from ``clients`` concurrent connections (each client takes the
next request as soon as its previous one is answered) and records each answer and its latency.
:func:`benchmark` runs the same load against the server started twice, with the batching flags
given and with ``--max-batch-tokens 1`` (every batch one sentence): throughput, p50/p95
latency, and how many answers differ from the unbatched server's for the same sentence.
"""
import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence

import httpx

from fairseq_plugins.analysis.report import markdown_table
from fairseq_plugins.network import free_port


class ServerProcess:
    """``COMMAND MODEL --port P FLAGS...`` on 127.0.0.1; the command is fairseq-plugins-serve's
    module in this interpreter unless given (the installed console script, in the tests)."""

    def __init__(self, model: str, flags: Sequence[str] = (), log: Optional[str] = None,
                 startup_timeout: float = 120, env: Optional[dict] = None,
                 command: Sequence[str] = (sys.executable, "-m", "fairseq_plugins.cli.serve")):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        out = open(log, "w") if log else subprocess.DEVNULL
        self.process = subprocess.Popen(
            [*command, model, "--host", "127.0.0.1", "--port", str(self.port), *map(str, flags)],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        deadline = time.monotonic() + startup_timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited {self.process.returncode} at startup:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server did not answer /health within {startup_timeout} s:\n{self.log()}")
            time.sleep(0.2)

    def log(self) -> str:
        if not self.log_path:
            return ""
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()[-4000:]

    def get(self, path: str) -> dict:
        return httpx.get(self.url + path, timeout=30).json()

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM, then its exit code."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def stop(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


@dataclass
class Answer:
    index: int  # of the request in the list sent
    status: int
    body: dict
    latency: float  # seconds


async def _load(url: str, payloads: List[dict], clients: int, timeout: float) -> List[Answer]:
    answers: List[Optional[Answer]] = [None] * len(payloads)
    queue = iter(range(len(payloads)))
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:
        async def one_client():
            for i in queue:  # shared: each client takes the next request
                start = time.perf_counter()
                response = await client.post("/translate", json=payloads[i])
                answers[i] = Answer(i, response.status_code, response.json(), time.perf_counter() - start)

        await asyncio.gather(*(one_client() for _ in range(clients)))
    return answers


def run_load(url: str, payloads: List[dict], clients: int, timeout: float = 300):
    """Every request of ``payloads`` answered (in their order), and the wall time of the whole load."""
    start = time.perf_counter()
    answers = asyncio.run(_load(url, payloads, clients, timeout))
    return answers, time.perf_counter() - start


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def _tokens(answer: Answer):
    return tuple(t["tokens"] for t in answer.body["translations"])


def benchmark(model: str, sentences: List[str], clients: int, requests: int, beam: int,
              batched_flags: Sequence[str], log_dir: str) -> str:
    """The markdown table of the two runs; requests cycle through ``sentences``, one each."""
    for name in ("httpx", "httpcore"):  # a line per request otherwise
        logging.getLogger(name).setLevel(logging.WARNING)
    payloads = [{"text": sentences[i % len(sentences)], "beam": beam} for i in range(requests)]
    runs = [("unbatched (--max-batch-tokens 1)", [*batched_flags, "--max-batch-tokens", "1"]),
            (f"batched ({' '.join(batched_flags) or 'default flags'})", list(batched_flags))]
    rows, reference = [], {}
    for name, flags in runs:
        with ServerProcess(model, flags, log=os.path.join(log_dir, f"serve-{len(rows)}.log")) as server:
            run_load(server.url, payloads[:clients], clients)  # warm-up, untimed
            answers, wall = run_load(server.url, payloads, clients)
            stats = server.get("/health")["batching"]
            exit_code = server.terminate()
        ok = [a for a in answers if a.status == 200]
        if not reference:
            reference = {payloads[a.index]["text"]: _tokens(a) for a in ok}
        differ = sum(_tokens(a) != reference.get(payloads[a.index]["text"]) for a in ok)
        latencies = [a.latency * 1000 for a in answers]
        rows.append([name, f"{len(ok)}/{requests}", f"{requests / wall:.1f}", f"{percentile(latencies, 50):.0f}",
                     f"{percentile(latencies, 95):.0f}", f"{stats['sentences'] / max(stats['batches'], 1):.2f}",
                     stats["largest_batch"], differ, exit_code])
    header = ["server", "answered 200", "requests/s", "p50 latency (ms)", "p95 latency (ms)",
              "sentences per batch (mean)", "largest batch", "answers ≠ unbatched", "exit code on SIGTERM"]
    return markdown_table(header, rows)
