"""How a run ends: on a scheduler's signal, and after its last update.

Behaviours (``FAIRSEQ_PLUGINS_DISABLE_PATCHES`` takes each name, or ``preemption`` for all):

* ``preemption``: sIGTERM/SIGUSR1 (a scheduler's notice of preemption): save ``checkpoint_last.pt`` and stop.

  fairseq-train ends at once on either signal, losing everything since the last save: up to a
  whole ``--save-interval`` of compute per preemption. With the suite, a signal only sets a flag.
  After each update every worker calls fairseq's ``validate_and_save``; there the workers
  all-reduce the flag, so all of them see a stop at the same update even when the signal reached
  only some (a collective that some ranks skip would deadlock). They finish that update's
  scheduled validation and saves as an uninterrupted run would, save ``checkpoint_last.pt``
  (atomically, see ``atomic_checkpoints``) if the update was not a save point, wait for each
  other (no worker exits before rank 0's checkpoint is complete), and exit at once with status
  :data:`EXIT_PREEMPTED` after rank 0 prints one line. The same command resumes from that
  update, so the run ends as an uninterrupted one would.

  ``--preemption-timeout S`` (default 60) bounds the wait: a worker that has not stopped S
  seconds after the signal (a long validation, a peer that died) prints one line and exits
  with the same status, without a new checkpoint. It is a field of fairseq's ``CheckpointConfig``
  (``cfg.checkpoint.preemption_timeout``), so it reaches the patch from ``fairseq-train``, from
  ``fairseq_cli.train.main(cfg)``, and from ``fairseq-hydra-train +checkpoint.preemption_timeout=S``
  (the ``+``: hydra composes its config before the suite is imported; hydra ≥ 1.1, as 1.0 adds
  no key to a structured config). The signals are armed when
  fairseq's training loop starts (``fairseq_cli.train.train``); the run's state lives on its trainer.

* ``clean_exit``: a finished run exits with status 0: fairseq's threads and process groups end before Python does.

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
import dataclasses
import logging
import os
import queue
import signal
import sys
import threading
import weakref

import fairseq_cli.train as fairseq_train
import torch
import torch.distributed as dist
from fairseq import checkpoint_utils
from fairseq.data import iterators
from fairseq.dataclass.configs import CheckpointConfig
from fairseq.dataclass.initialize import hydra_init
from fairseq.distributed import utils as distributed_utils

from fairseq_plugins.errors import ConfigError
from fairseq_plugins.patches._mechanism import Patch, Target, config_options

# -- preemption --------------------------------------------------------------------------------------------------------

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: "try again later" -- rerun the same command
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
DEFAULT_TIMEOUT = 60.0


@dataclasses.dataclass
class _Option:
    preemption_timeout: float = dataclasses.field(default=DEFAULT_TIMEOUT, metadata={
        "help": "on SIGTERM/SIGUSR1 save checkpoint_last.pt at the next update and exit with status "
                f"{EXIT_PREEMPTED}; give up (no new checkpoint) after this many seconds"})


TRAIN = Target(fairseq_train, "train", "cfg, trainer, task, epoch_itr")
VALIDATE_AND_SAVE = Target(fairseq_train, "validate_and_save",
                           "cfg, trainer, task, epoch_itr, valid_subsets, end_of_epoch")
SAVE = Target(checkpoint_utils, "save_checkpoint", "cfg, trainer, epoch_itr, val_loss")


class Preemption:
    """One training run's signals and stop (kept on its trainer as ``trainer.preemption``)."""

    def __init__(self, timeout):
        self.timeout = timeout
        self.received = None  # the name of the first signal received
        self.saved_at = None  # the update of the last checkpoint written by this trainer
        self.stopping = False  # the checkpoint of the stop is written; only exiting remains

    def arm(self):
        """Turn SIGTERM/SIGUSR1 into a stop at the next update of this run."""
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        signal.set_wakeup_fd(write_fd)
        threading.Thread(target=self._watch, args=(read_fd,), daemon=True).start()
        for signum in SIGNALS:
            signal.signal(signum, _on_signal)

    def _watch(self, read_fd):
        """Record each signal as soon as it arrives, and arm the deadline.

        The main thread runs Python signal handlers only between bytecodes, so one blocked in a
        collective that a dead or frozen peer never completes would not see the signal at all;
        ``signal.set_wakeup_fd`` writes the signal's number to a pipe from the C handler instead.
        """
        while True:
            signum = os.read(read_fd, 1)[0]
            if signum in SIGNALS and self.received is None:
                self.received = signal.Signals(signum).name
                timer = threading.Timer(self.timeout, self._give_up)
                timer.daemon = True
                timer.start()

    def _give_up(self):
        if not self.stopping:
            print(f"error: {self.received}: no update boundary reached within --preemption-timeout "
                  f"{self.timeout:g} s; stopped without a new checkpoint (a restart resumes from checkpoint_last.pt)",
                  file=sys.stderr, flush=True)
        os._exit(EXIT_PREEMPTED)


def _on_signal(signum, frame):
    """Python's handler: only there to replace the default action (the watcher records the signal)."""


def _timeout(cfg):
    timeout = cfg.checkpoint.get("preemption_timeout", DEFAULT_TIMEOUT)
    if not timeout > 0:
        raise ConfigError(f"--preemption-timeout {timeout:g}: must be a positive number of seconds")
    return timeout


def _stop_agreed(trainer, preemption):
    """Whether any worker received a signal: one all-reduce of a flag per update."""
    flag = torch.tensor([float(preemption.received is not None)], device=trainer.device)
    if trainer.data_parallel_world_size > 1:
        distributed_utils.all_reduce(flag, group=trainer.data_parallel_process_group, op="max")
    return flag.item() > 0


def train(cfg, trainer, task, epoch_itr):
    """fairseq's epoch loop; the run's first epoch arms the signals (the main thread of a worker)."""
    if "preemption" not in vars(trainer):
        trainer.preemption = Preemption(_timeout(cfg))
        if threading.current_thread() is threading.main_thread():  # signals reach only the main thread
            trainer.preemption.arm()
    return TRAIN(cfg, trainer, task, epoch_itr)


def save_checkpoint(cfg, trainer, epoch_itr, val_loss):
    path = SAVE(cfg, trainer, epoch_itr, val_loss)
    if "preemption" in vars(trainer):
        trainer.preemption.saved_at = trainer.get_num_updates()
    return path


def _stop(cfg, trainer, epoch_itr, preemption):
    """Save the stop's checkpoint, wait for every worker to be there, and exit at once."""
    update = trainer.get_num_updates()
    if preemption.saved_at != update:
        checkpoint_utils.save_checkpoint(cfg.checkpoint, trainer, epoch_itr, None)
    preemption.stopping = True
    if trainer.data_parallel_world_size > 1:
        # No worker leaves before rank 0's checkpoint is complete: a launcher that ends the job at its
        # first exit (torchrun, srun --kill-on-bad-exit) would kill rank 0 in the middle of the save.
        dist.barrier(group=trainer.data_parallel_process_group)
    if trainer.data_parallel_rank == 0:
        last = os.path.join(cfg.checkpoint.save_dir, f"checkpoint_last{trainer.checkpoint_suffix}.pt")
        print(f"preempted ({preemption.received or 'signal to another worker'}): saved {last} at update "
              f"{update}; rerun the same command to resume (exit status {EXIT_PREEMPTED})",
              file=sys.stderr, flush=True)
    # The checkpoint is durable (atomic_checkpoints fsyncs it). Nothing runs after it that could turn the
    # stop into a death by signal: no interpreter teardown of fairseq's threads and gloo groups, which
    # races with the peers' own exits (a worker died of SIGABRT there); as --preemption-timeout does.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_PREEMPTED)


def validate_and_save(cfg, trainer, task, epoch_itr, valid_subsets, end_of_epoch):
    preemption = vars(trainer).get("preemption")
    stop = preemption is not None and _stop_agreed(trainer, preemption)
    valid_losses, should_stop = VALIDATE_AND_SAVE(cfg, trainer, task, epoch_itr, valid_subsets, end_of_epoch)
    if stop and not should_stop:  # a run that ends here anyway ends normally
        _stop(cfg, trainer, epoch_itr, preemption)
    return valid_losses, should_stop


# -- clean_exit --------------------------------------------------------------------------------------------------------

CONSUMER = Target(iterators, "BackgroundConsumer", "queue, source, max_len, cuda_device")
# fairseq's consumer thread's own state, which the run() below reads as fairseq's does
CONSUMER_READS = [Target(iterators, "_sentinel"),
                  *(Target(iterators.BackgroundConsumer, name, instance=True)
                    for name in ("_queue", "_source", "_max_len", "count", "cuda_device"))]

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


PATCHES = [
    Patch("preemption", {
        **config_options(CheckpointConfig, _Option),  # --preemption-timeout, a field of fairseq's CheckpointConfig
        TRAIN: train, VALIDATE_AND_SAVE: validate_and_save, SAVE: save_checkpoint,
    }, setup=hydra_init, teardown=hydra_init),
    Patch("clean_exit", {CONSUMER: BackgroundConsumer}, reads=CONSUMER_READS, setup=lambda: atexit.register(_at_exit),
          teardown=lambda: atexit.unregister(_at_exit)),
]
