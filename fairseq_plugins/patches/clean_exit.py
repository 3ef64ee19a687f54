"""A finished run exits with status 0: fairseq's threads and process groups end before Python does.

Python kills the daemon threads that take the GIL back during finalisation with
``pthread_exit``; unwinding through torch's ``noexcept`` C++ frames calls ``std::terminate``, and
a run that has saved its last checkpoint prints ``terminate called without an active
exception`` and aborts (SIGABRT, a failure to any script or scheduler). Two sources:

* fairseq's ``BufferedIterator`` (``--data-buffer-size``, default 10) collates batches in a
  daemon thread that is still inside torch ops when training ends. Here the consumer checks a
  stop event between items and never blocks for good on a full queue.
* a gloo process group left alive: its C++ worker threads still hold finished collectives'
  tensors, freed during finalisation (torch never destroys the group on its own).

An ``atexit`` hook, which runs while the interpreter is whole, stops and joins every live
consumer and destroys the default process group.
"""
import atexit
import queue
import sys
import threading
import weakref

import torch
import torch.distributed as dist
from fairseq.data import iterators

from fairseq_plugins.patches._mechanism import Patch, Target

CONSUMER = Target(iterators, "BackgroundConsumer", "queue, source, max_len, cuda_device")

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


def stop_consumers():
    """Stop every prefetching thread and wait for it (the item in hand is finished first)."""
    consumers = list(_live)
    for consumer in consumers:
        consumer.stop.set()
    for consumer in consumers:
        if consumer.is_alive():
            consumer.join(_JOIN_S)


def destroy_process_group():
    if dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except RuntimeError as e:  # the run's result is already decided; say why teardown failed
            print(f"warning: destroying the process group at exit failed: {e}", file=sys.stderr)


def _at_exit():
    stop_consumers()
    destroy_process_group()


PATCH = Patch(__name__, {CONSUMER: BackgroundConsumer}, setup=lambda: atexit.register(_at_exit),
              teardown=lambda: atexit.unregister(_at_exit))
