"""fairseq's data-prefetching thread stops before the interpreter does.

``BufferedIterator`` (``--data-buffer-size``, default 10) collates batches in a daemon thread
that keeps running, inside torch ops with the GIL released, when training ends. Python kills
daemon threads that take the GIL back during finalisation with ``pthread_exit``; unwinding
through torch's ``noexcept`` C++ frames calls ``std::terminate``: the process prints
``terminate called without an active exception`` and aborts after a successful run (a
non-zero exit a script or scheduler reads as a failure).

Here the consumer checks a stop event between items and never blocks for good on a full
queue; an ``atexit`` hook (run before finalisation) stops and joins every live consumer.
"""
import atexit
import queue
import threading
import weakref

import torch
from fairseq.data import iterators

_POLL_S = 0.05  # how often a consumer waiting on a full queue looks for the stop event
_JOIN_S = 60.0  # an item being collated finishes well within this
_live = weakref.WeakSet()


class BackgroundConsumer(iterators.BackgroundConsumer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.stop = threading.Event()
        _live.add(self)

    def _put(self, item):
        while not self.stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                pass
        return False

    def run(self):
        if self.cuda_device is not None:  # as fairseq: no context on GPU 0 with pin_memory
            torch.cuda.set_device(self.cuda_device)
        try:
            for item in self._source:
                if not self._put(item):
                    return
                self.count += 1
                if self._max_len is not None and self.count >= self._max_len:
                    break
            self._put(iterators._sentinel)
        except Exception as e:  # handed to the training loop, as fairseq does
            self._put(e)


def stop_all():
    """Stop every prefetching thread and wait for it (the item in hand is finished first)."""
    consumers = list(_live)
    for consumer in consumers:
        consumer.stop.set()
    for consumer in consumers:
        if consumer.is_alive():
            consumer.join(_JOIN_S)


def install():
    if iterators.BackgroundConsumer is not BackgroundConsumer:
        iterators.BackgroundConsumer = BackgroundConsumer
        atexit.register(stop_all)
