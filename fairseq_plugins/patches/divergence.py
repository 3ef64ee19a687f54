"""``--on-divergence rollback``: refuse a diverging update, skip its batches, lower the lr, go on.

fairseq stops a run at the first non-finite gradient (``numerical_faults`` turns that into one
line), and under ``--fp16``/``--bf16`` at "Minimum loss scale reached"; a loss that explodes but
stays finite trains on. With ``--on-divergence rollback`` an update is checked after its
gradients are summed over the workers and before the optimizer step: a non-finite gradient
norm, a non-finite loss, a loss per target token above ``--divergence-factor`` times the running
mean of the accepted updates (checked from the ``WARMUP``-th accepted update on), or the loss
scaler's floor. Such an update is not applied: the model, the optimizer and the loss scale are
those of the last good update (nothing was stepped, so nothing is reloaded), the data position
is past its batches (they are skipped), the update count does not advance (the next batches
take its number, and its seed), and the learning rate is multiplied by ``--divergence-lr-factor``
for the rest of the run (saved in the checkpoint, restored on resume). One line says so. After
``--max-rollbacks`` rollbacks the next divergence stops the run as ``stop`` does, with the same
one-line report. Every worker sees the same summed gradients and the same summed loss (one
all-reduce of two numbers per update), so all take the same decision at the same update and no
collective is left waiting. ``stop`` (the default) is fairseq's behaviour.
"""
import dataclasses
import logging

import torch
from fairseq import checkpoint_utils
from fairseq.dataclass.configs import OptimizationConfig
from fairseq.dataclass.constants import ChoiceEnum
from fairseq.dataclass.initialize import hydra_init
from fairseq.distributed import utils as distributed_utils
from fairseq.optim.fairseq_optimizer import FairseqOptimizer
from fairseq.tasks import FairseqTask
from fairseq.trainer import Trainer

from fairseq_plugins.errors import ConfigError, NumericalError
from fairseq_plugins.patches._mechanism import Patch, Target, config_options

logger = logging.getLogger(__name__)

WARMUP = 10  # accepted updates before the loss is compared with its running mean
WINDOW = 100  # the running mean: an average of the first WINDOW losses, then an exponential one of that span
STATE = "divergence"  # extra_state key: the lr scale and the rollbacks so far
GUARD = "_divergence_guard"  # on the criterion, which the trainer and the task's train_step share


@dataclasses.dataclass
class _Options:
    on_divergence: ChoiceEnum(["stop", "rollback"]) = dataclasses.field(default="stop", metadata={
        "help": "on a non-finite gradient or loss, a loss above --divergence-factor x its running mean, or the "
                "fp16 loss-scale floor: stop (fairseq's behaviour), or rollback (skip the update's batches, "
                "multiply the lr by --divergence-lr-factor, go on)"})
    divergence_factor: float = dataclasses.field(default=5.0, metadata={
        "help": "with --on-divergence rollback: a loss per token above this many times its running mean is a "
                "divergence (0: only non-finite values are)"})
    divergence_lr_factor: float = dataclasses.field(default=0.5, metadata={
        "help": "with --on-divergence rollback: the learning rate is multiplied by this at each rollback"})
    max_rollbacks: int = dataclasses.field(default=5, metadata={
        "help": "with --on-divergence rollback: after this many rollbacks the next divergence stops the run"})


OPTIONS = {f.name: f.default for f in dataclasses.fields(_Options)}
TRAIN_STEP = Target(Trainer, "train_step", "self, samples, raise_oom")
CLIP = Target(Trainer, "clip_grad_norm", "self, clip_norm")
SAVE = Target(Trainer, "save_checkpoint", "self, filename, extra_state")
TASK_STEP = Target(FairseqTask, "train_step", "self, sample, model, criterion, optimizer, update_num, ignore_grad")
SET_LR = Target(FairseqOptimizer, "set_lr", "self, lr")
LOAD_CHECKPOINT = Target(checkpoint_utils, "load_checkpoint", "cfg, trainer, **passthrough_args")


class _Diverged(Exception):
    """Raised before the optimizer step (no subclass of what fairseq's train_step catches).

    ``fairseq_stops``: whether fairseq itself stops on it (a non-finite gradient, the loss-scale floor).
    """

    def __init__(self, reason, fairseq_stops):
        super().__init__(reason)
        self.fairseq_stops = fairseq_stops


class _Guard:
    """One run's rollback state (kept on its criterion)."""

    def __init__(self, cfg):
        self.factor, self.lr_factor = cfg.divergence_factor, cfg.divergence_lr_factor
        self.max_rollbacks = cfg.max_rollbacks
        self.rollbacks, self.lr_scale = 0, 1.0
        self.mean, self.accepted = None, 0
        self.loss = self.tokens = None  # this update's sums over its batches, on this worker
        self.scaler = self.scaler_state = None
        self.off = False  # while an exhausted guard re-runs the update for fairseq's report

    def start(self, trainer):
        self.loss = self.tokens = 0.0
        self.scaler = getattr(trainer.optimizer, "scaler", None)  # fp16's loss scaler
        self.scaler_state = None if self.scaler is None else dict(vars(self.scaler))

    def restore_scaler(self):
        """The loss scaler as before the refused update (fairseq's scaler cannot go on after its floor)."""
        if self.scaler is not None:
            vars(self.scaler).update(self.scaler_state)

    def add(self, loss, sample_size):
        self.loss, self.tokens = self.loss + loss, self.tokens + sample_size

    def check(self, trainer, grad_norm):
        """Why this update diverges, or None (the same answer on every worker)."""
        sums = torch.tensor([float(self.loss), float(self.tokens)], dtype=torch.float64, device=trainer.device)
        if trainer.data_parallel_world_size > 1:
            distributed_utils.all_reduce(sums, group=trainer.data_parallel_process_group)
        loss = (sums[0] / sums[1].clamp(min=1)).item()
        if not torch.isfinite(grad_norm).all():
            return "the gradient norm is not finite"
        if loss != loss or abs(loss) == float("inf"):
            return "the loss is not finite"
        if self.factor > 0 and self.accepted >= WARMUP and loss > self.factor * self.mean:
            return f"the loss per token {loss:.4g} is above {self.factor:g} x its running mean {self.mean:.4g}"
        self.accepted += 1
        self.mean = loss if self.mean is None else self.mean + (loss - self.mean) / min(self.accepted, WINDOW)
        return None


def _options(cfg):
    optimization = cfg.optimization
    values = {name: optimization.get(name, default) for name, default in OPTIONS.items()}
    if values["on_divergence"] not in ("stop", "rollback"):
        raise ConfigError(f"--on-divergence {values['on_divergence']}: must be stop or rollback")
    if not values["divergence_factor"] >= 0:
        raise ConfigError(f"--divergence-factor {values['divergence_factor']:g}: must be 0 (off) or positive")
    if not 0 < values["divergence_lr_factor"] <= 1:
        raise ConfigError(f"--divergence-lr-factor {values['divergence_lr_factor']:g}: must be in (0, 1]")
    if values["max_rollbacks"] < 0:
        raise ConfigError(f"--max-rollbacks {values['max_rollbacks']}: must be 0 or more")
    return dataclasses.replace(_Options(), **values)


def _guard(trainer):
    """The run's _Guard under --on-divergence rollback, else None."""
    criterion = trainer.criterion
    if GUARD not in vars(criterion):
        options = _options(trainer.cfg)
        vars(criterion)[GUARD] = _Guard(options) if options.on_divergence == "rollback" else None
    guard = vars(criterion)[GUARD]
    return None if guard is None or guard.off else guard


def _base_optimizer(trainer):
    """The FairseqOptimizer whose set_lr every lr change ends in (fp16 wrappers delegate to it)."""
    optimizer = trainer.optimizer
    while hasattr(optimizer, "fp32_optimizer") or hasattr(optimizer, "wrapped_optimizer"):
        optimizer = getattr(optimizer, "fp32_optimizer", None) or optimizer.wrapped_optimizer
    return optimizer


def set_lr(self, lr):
    """fairseq's ``set_lr``, times the run's lr scale (1 until a rollback)."""
    return SET_LR(self, lr * vars(self).get("_divergence_lr_scale", 1.0))


def _scale_lr(trainer, guard, factor):
    optimizer = _base_optimizer(trainer)
    guard.lr_scale *= factor
    vars(optimizer)["_divergence_lr_scale"] = guard.lr_scale
    SET_LR(optimizer, optimizer.get_lr() * factor)  # the lr of the next update; the scheduler's next ones are scaled


def task_train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
    loss, sample_size, logging_output = TASK_STEP(self, sample, model, criterion, optimizer, update_num, ignore_grad)
    guard = vars(criterion).get(GUARD)
    if guard is not None and guard.loss is not None and not ignore_grad:  # ignore_grad: a dummy batch
        guard.add(logging_output.get("loss", 0.0), sample_size)
    return loss, sample_size, logging_output


def clip_grad_norm(self, clip_norm):
    guard = _guard(self)
    if guard is None:
        return CLIP(self, clip_norm)
    try:
        grad_norm = CLIP(self, clip_norm)
    except FloatingPointError as error:  # the fp16 loss scaler at its floor, the same on every worker
        raise _Diverged((str(error).splitlines() or ["loss scale floor"])[0].split(". ")[0], True) from error
    reason = guard.check(self, grad_norm)
    if reason is not None:
        raise _Diverged(reason, not torch.isfinite(grad_norm).all())
    return grad_norm


def train_step(self, samples, raise_oom=False):
    guard = _guard(self)
    if guard is None:
        return TRAIN_STEP(self, samples, raise_oom)
    guard.start(self)
    try:
        return TRAIN_STEP(self, samples, raise_oom)
    except _Diverged as diverged:
        return _roll_back(self, guard, samples, diverged)
    finally:
        guard.loss = guard.tokens = None


def _roll_back(trainer, guard, samples, diverged):
    """Skip the update whose check failed (nothing was stepped), or stop after --max-rollbacks."""
    trainer.zero_grad()
    guard.restore_scaler()
    reason = str(diverged)
    update = trainer.get_num_updates() + 1
    ids = sorted(i for s in samples if s and "id" in s for i in s["id"].tolist())
    if guard.rollbacks >= guard.max_rollbacks:
        if diverged.fairseq_stops:  # re-run as fairseq would: its FloatingPointError becomes the usual report
            guard.off = True
            try:
                return TRAIN_STEP(trainer, samples)
            finally:
                guard.off = False
        raise NumericalError(f"update {update}: {reason}; stopped after --max-rollbacks {guard.max_rollbacks} "
                             f"rollbacks (sentence ids on rank {trainer.data_parallel_rank}: {ids})")
    guard.rollbacks += 1
    old_lr = trainer.get_lr()
    _scale_lr(trainer, guard, guard.lr_factor)
    logger.warning(f"update {update}: {reason}; rolled back: the update is not applied (the model and optimizer are "
                   f"those of update {update - 1}), its batches are skipped (sentence ids on rank "
                   f"{trainer.data_parallel_rank}: {ids}), lr {old_lr:g} -> {trainer.get_lr():g} "
                   f"(--divergence-lr-factor {guard.lr_factor:g}); rollback {guard.rollbacks} of --max-rollbacks "
                   f"{guard.max_rollbacks}")
    return None


def save_checkpoint(self, filename, extra_state):
    guard = _guard(self)
    if guard is not None and extra_state is not None:
        extra_state[STATE] = {"lr_scale": guard.lr_scale, "rollbacks": guard.rollbacks}
    return SAVE(self, filename, extra_state)


def load_checkpoint(cfg, trainer, **passthrough_args):
    """fairseq's resume; then the lr scale and rollback count of the run it continues."""
    extra_state, epoch_itr = LOAD_CHECKPOINT(cfg, trainer, **passthrough_args)
    state = (extra_state or {}).get(STATE) if isinstance(trainer, Trainer) else None
    guard = _guard(trainer) if state is not None else None
    if guard is not None:
        guard.rollbacks = state["rollbacks"]
        _scale_lr(trainer, guard, state["lr_scale"])
    return extra_state, epoch_itr


PATCH = Patch(__name__, {
    **config_options(OptimizationConfig, _Options),
    TRAIN_STEP: train_step, CLIP: clip_grad_norm, TASK_STEP: task_train_step, SET_LR: set_lr,
    SAVE: save_checkpoint, LOAD_CHECKPOINT: load_checkpoint,
}, requires=("numerical_faults",), setup=hydra_init, teardown=hydra_init)
