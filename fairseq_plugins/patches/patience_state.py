"""``--patience`` survives a restart; a run that stopped early stays stopped.

fairseq keeps early stopping's state (the best validation value and the count of validations
since it improved) as attributes of the function ``fairseq_cli.train.should_stop_early``, in
memory only (fairseq#3531): a run killed after two non-improving validations and resumed counts
from zero again and stops ``--patience`` validations later than an uninterrupted run; a run that
did stop early, started again with the same command, trains on. Here every checkpoint records
that state (``extra_state["patience"]``) and a resume restores it. Where the restored count has
reached ``--patience`` the run is over: rank 0 prints one line and every rank exits with status 0
before anything is written (each decides from the state rank 0 read and broadcast).
"""
import sys

import fairseq_cli.train as fairseq_train
from fairseq import checkpoint_utils
from fairseq.trainer import Trainer

from fairseq_plugins.patches._mechanism import Patch, Target

SAVE = Target(Trainer, "save_checkpoint", "self, filename, extra_state")
LOAD_CHECKPOINT = Target(checkpoint_utils, "load_checkpoint", "cfg, trainer, **passthrough_args")
STATE = "patience"


def save_checkpoint(self, filename, extra_state):
    """fairseq's ``Trainer.save_checkpoint``, with early stopping's state in ``extra_state``."""
    tracker = fairseq_train.should_stop_early  # the function fairseq's loop calls holds the state
    if extra_state is not None and getattr(tracker, "best", None) is not None:
        extra_state[STATE] = {"best": float(tracker.best), "num_runs": int(tracker.num_runs)}
    return SAVE(self, filename, extra_state)


def load_checkpoint(cfg, trainer, **passthrough_args):
    """fairseq's resume; then early stopping's state, and the end of a run that stopped early."""
    extra_state, epoch_itr = LOAD_CHECKPOINT(cfg, trainer, **passthrough_args)
    state = (extra_state or {}).get(STATE) if isinstance(trainer, Trainer) else None
    if state is None:
        return extra_state, epoch_itr
    tracker = fairseq_train.should_stop_early
    tracker.best, tracker.num_runs = state["best"], state["num_runs"]
    patience = trainer.cfg.checkpoint.patience
    if 0 < patience <= state["num_runs"]:
        if trainer.data_parallel_rank == 0:
            print(f"already stopped early at update {trainer.get_num_updates()}: {state['num_runs']} validations "
                  f"without improving on {trainer.cfg.checkpoint.best_checkpoint_metric} {state['best']:g} "
                  f"(--patience {patience}); nothing to do", flush=True)
        sys.exit(0)
    return extra_state, epoch_itr


PATCH = Patch(__name__, {SAVE: save_checkpoint, LOAD_CHECKPOINT: load_checkpoint})
