"""Dynamic batching: sentences of concurrent requests decoded together.

Each sentence waits in one queue. A batch is the oldest waiting sentence and, in arrival order,
the later ones with the same :class:`~fairseq_plugins.serve.backends.Options`, as long as the
padded batch (sentences x longest source, ``</s>`` counted) stays within ``max_batch_tokens``;
it leaves when it is full or when its oldest sentence has waited ``max_delay_ms``, and one of
``workers`` threads decodes it. A client that disconnects is still answered into the void
(Starlette does not cancel a plain handler), so its batch is unchanged; a request cancelled
while it waits (uvicorn's ``--graceful-timeout`` running out) is dropped from the queue, and
one cancelled in a running batch has its result discarded.
"""
import asyncio
import collections
import functools
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import List

from fairseq_plugins.serve.backends import Hypothesis, Options

logger = logging.getLogger(__name__)


@dataclass
class _Item:
    tokens: List[str]
    options: Options
    future: asyncio.Future
    arrived: float


@dataclass
class BatchStats:
    batches: int = 0
    sentences: int = 0
    largest_batch: int = 0
    batches_of_several: int = 0  # batches of more than one sentence
    failed_batches: int = 0

    def as_dict(self):
        return asdict(self)


class Batcher:
    def __init__(self, backend, max_batch_tokens: int, max_delay_ms: float, workers: int):
        self.backend, self.max_batch_tokens = backend, max_batch_tokens
        self.max_delay = max_delay_ms / 1000
        self.workers = workers
        self.stats = BatchStats()
        self._pending: collections.deque = collections.deque()

    async def start(self):
        self._loop = asyncio.get_running_loop()
        self._arrival = asyncio.Event()
        self._free = asyncio.Semaphore(self.workers)
        self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="translate")
        self._scheduler = asyncio.create_task(self._schedule())

    async def stop(self):
        """After the server has answered every request: no batch is in flight."""
        self._scheduler.cancel()
        self._executor.shutdown(wait=True)

    @property
    def waiting(self) -> int:
        """Sentences queued for a batch (their clients still there)."""
        return sum(not item.future.done() for item in self._pending)

    async def translate(self, sources: List[List[str]], options: Options) -> List[List[Hypothesis]]:
        """The hypotheses of each sentence of ``sources``, in order."""
        now = self._loop.time()
        items = [_Item(tokens, options, self._loop.create_future(), now) for tokens in sources]
        self._pending.extend(items)
        self._arrival.set()
        return list(await asyncio.gather(*(item.future for item in items)))

    async def _schedule(self):
        while True:
            await self._free.acquire()
            batch = await self._next_batch()
            done = self._loop.run_in_executor(self._executor, self.backend.translate,
                                              [item.tokens for item in batch], batch[0].options)
            done.add_done_callback(functools.partial(self._deliver, batch))

    def _select(self):
        """The batch of the oldest waiting sentence, and whether a same-options sentence was left out."""
        self._pending = collections.deque(item for item in self._pending if not item.future.done())
        if not self._pending:
            return [], False
        options = self._pending[0].options
        batch, longest = [], 0
        for item in self._pending:
            if item.options != options:
                continue
            width = max(longest, len(item.tokens) + 1)
            if batch and width * (len(batch) + 1) > self.max_batch_tokens:
                return batch, True
            batch.append(item)
            longest = width
        return batch, False

    async def _next_batch(self) -> List[_Item]:
        while True:
            batch, full = self._select()
            if batch:
                wait = batch[0].arrived + self.max_delay - self._loop.time()
                if full or wait <= 0:
                    taken = set(map(id, batch))
                    self._pending = collections.deque(i for i in self._pending if id(i) not in taken)
                    return batch
            self._arrival.clear()
            try:
                await asyncio.wait_for(self._arrival.wait(), wait if batch else None)
            except asyncio.TimeoutError:
                pass

    def _deliver(self, batch: List[_Item], done: asyncio.Future):
        self._free.release()
        stats = self.stats
        stats.batches += 1
        stats.sentences += len(batch)
        stats.largest_batch = max(stats.largest_batch, len(batch))
        stats.batches_of_several += len(batch) > 1
        error = done.exception()
        if error is not None:
            stats.failed_batches += 1
            logger.error("a batch of %d sentences failed: %s", len(batch), error, exc_info=error)
        for k, item in enumerate(batch):
            if item.future.done():  # its request was cancelled
                continue
            if error is not None:
                item.future.set_exception(error)
            else:
                item.future.set_result(done.result()[k])
