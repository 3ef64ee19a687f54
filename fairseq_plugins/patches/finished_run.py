"""A finished ``fairseq-train`` run stays finished: the same command again ends at once.

fairseq's training loop takes an update before it compares the update count with
``--max-update``, so rerunning a command whose ``checkpoint_last.pt`` is at update N = --max-update
(a pipeline script run twice, a job requeued after its final save, a worker killed between
that save and its exit) trains update N+1 and overwrites ``checkpoint_last.pt`` and
``checkpoint_best.pt``. Here, right after fairseq has loaded the checkpoint and restored the
train iterator, a run at or past ``--max-update``, or whose last completed epoch is ``--max-epoch``
or later, prints one line (rank 0) and exits with status 0 before anything is written.

Every rank decides from the state it has just loaded: rank 0's file, which ``Trainer.load_checkpoint``
broadcast to the others (update count and iterator state alike), so all ranks stop together and no
collective is left waiting.
"""
import math
import sys

from fairseq import checkpoint_utils
from fairseq.trainer import Trainer

from fairseq_plugins.patches._mechanism import Patch, Target

LOAD_CHECKPOINT = Target(checkpoint_utils, "load_checkpoint", "cfg, trainer, **passthrough_args")


def _finished(cfg, trainer, epoch_itr):
    """The one line to print if the loaded run has nothing left to train, else None."""
    max_update = cfg.optimization.max_update or math.inf
    max_epoch = cfg.optimization.max_epoch or math.inf
    update = trainer.get_num_updates()
    if update >= max_update:
        return f"already trained to update {update}; nothing to do"
    if epoch_itr.next_epoch_idx > max_epoch:  # fairseq's own loop condition: no epoch would start
        return f"already trained to update {update}; nothing to do (--max-epoch {cfg.optimization.max_epoch} reached)"
    return None


def load_checkpoint(cfg, trainer, **passthrough_args):
    """fairseq's resume; then the end of a run that is already finished."""
    extra_state, epoch_itr = LOAD_CHECKPOINT(cfg, trainer, **passthrough_args)
    # Only a training run's resume (not a fresh start, nor a caller with a stand-in trainer) can be finished.
    resumed_run = extra_state is not None and isinstance(trainer, Trainer)
    line = _finished(trainer.cfg, trainer, epoch_itr) if resumed_run else None
    if line is not None:
        if trainer.data_parallel_rank == 0:
            print(line, flush=True)
        sys.exit(0)
    return extra_state, epoch_itr


PATCH = Patch(__name__, {LOAD_CHECKPOINT: load_checkpoint})
