"""SIGTERM/SIGUSR1 (a scheduler's notice of preemption): save ``checkpoint_last.pt`` and stop.

fairseq-train ends at once on either signal, losing everything since the last save: up to a
whole ``--save-interval`` of compute per preemption. With the suite, a signal only sets a flag.
After each update every worker calls fairseq's ``validate_and_save``; there the workers
all-reduce the flag, so all of them see a stop at the same update even when the signal reached
only some (a collective that some ranks skip would deadlock). They finish that update's
scheduled validation and saves as an uninterrupted run would, save ``checkpoint_last.pt``
(atomically, see ``atomic_checkpoints``) if the update was not a save point, and exit with
status :data:`EXIT_PREEMPTED` after rank 0 prints one line. The same command resumes from that
update, so the run ends as an uninterrupted one would.

``--preemption-timeout S`` (default 60) bounds the wait: a worker that has not stopped S
seconds after the signal (a long validation, a peer that died) prints one line and exits
with the same status, without a new checkpoint.
"""
import argparse
import os
import signal
import sys
import threading

import fairseq_cli.train as fairseq_train
import torch
from fairseq import checkpoint_utils, options
from fairseq.distributed import utils as distributed_utils

from fairseq_plugins.errors import ConfigError

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: "try again later" -- rerun the same command
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
DEFAULT_TIMEOUT = 60.0


class _State:
    received = None  # the name of the first signal received
    timeout = DEFAULT_TIMEOUT
    saved_at = None  # the update of the last checkpoint written in this process
    stopping = False  # the checkpoint of the stop is written; only exiting remains


def add_checkpoint_args(parser, _fairseq=options.add_checkpoint_args):
    group = _fairseq(parser)
    group.add_argument("--preemption-timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                       help="on SIGTERM/SIGUSR1 save checkpoint_last.pt at the next update and exit with "
                            f"status {EXIT_PREEMPTED}; give up (no new checkpoint) after S seconds")
    return group


def _timeout_flag():
    """``--preemption-timeout`` from the command line (every worker has it: torchrun, srun, spawn)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--preemption-timeout", type=float, default=DEFAULT_TIMEOUT)
    timeout = parser.parse_known_args(sys.argv[1:])[0].preemption_timeout
    if not timeout > 0:
        raise ConfigError(f"--preemption-timeout {timeout:g}: must be a positive number of seconds")
    return timeout


def _give_up():
    if not _State.stopping:
        print(f"error: {_State.received}: no update boundary reached within --preemption-timeout "
              f"{_State.timeout:g} s; stopped without a new checkpoint (a restart resumes from checkpoint_last.pt)",
              file=sys.stderr, flush=True)
    os._exit(EXIT_PREEMPTED)


def _on_signal(signum, frame):
    """Python's handler: only there to replace the default action (the watcher records the signal)."""


def _watch(read_fd):
    """Record each signal as soon as it arrives, and arm the deadline.

    The main thread runs Python signal handlers only between bytecodes, so one blocked in a
    collective that a dead or frozen peer never completes would not see the signal at all;
    ``signal.set_wakeup_fd`` writes the signal's number to a pipe from the C handler instead.
    """
    while True:
        signum = os.read(read_fd, 1)[0]
        if signum in SIGNALS and _State.received is None:
            _State.received = signal.Signals(signum).name
            timer = threading.Timer(_State.timeout, _give_up)
            timer.daemon = True
            timer.start()


def _stop_agreed(trainer):
    """Whether any worker received a signal: one all-reduce of a flag per update."""
    flag = torch.tensor([float(_State.received is not None)], device=trainer.device)
    if trainer.data_parallel_world_size > 1:
        distributed_utils.all_reduce(flag, group=trainer.data_parallel_process_group, op="max")
    return flag.item() > 0


def save_checkpoint(cfg, trainer, epoch_itr, val_loss, _fairseq=checkpoint_utils.save_checkpoint):
    path = _fairseq(cfg, trainer, epoch_itr, val_loss)
    _State.saved_at = trainer.get_num_updates()
    return path


def validate_and_save(cfg, trainer, task, epoch_itr, valid_subsets, end_of_epoch,
                      _fairseq=fairseq_train.validate_and_save):
    stop = _stop_agreed(trainer)
    valid_losses, should_stop = _fairseq(cfg, trainer, task, epoch_itr, valid_subsets, end_of_epoch)
    if stop and not should_stop:  # a run that ends here anyway ends normally
        update = trainer.get_num_updates()
        if _State.saved_at != update:
            checkpoint_utils.save_checkpoint(cfg.checkpoint, trainer, epoch_itr, None)
        _State.stopping = True
        if trainer.data_parallel_rank == 0:
            last = os.path.join(cfg.checkpoint.save_dir, f"checkpoint_last{trainer.checkpoint_suffix}.pt")
            print(f"preempted ({_State.received or 'signal to another worker'}): saved {last} at update {update}; "
                  f"rerun the same command to resume (exit status {EXIT_PREEMPTED})", file=sys.stderr, flush=True)
        sys.exit(EXIT_PREEMPTED)
    return valid_losses, should_stop


def main(cfg, _fairseq=fairseq_train.main, **kwargs):
    """fairseq-train's per-worker ``main`` with the signals turned into a stop at the next update."""
    _State.timeout = _timeout_flag()
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd)
    threading.Thread(target=_watch, args=(read_fd,), daemon=True).start()
    for signum in SIGNALS:
        signal.signal(signum, _on_signal)
    return _fairseq(cfg, **kwargs)


def install():
    options.add_checkpoint_args = add_checkpoint_args
    checkpoint_utils.save_checkpoint = save_checkpoint
    fairseq_train.validate_and_save = validate_and_save
    fairseq_train.main = main
