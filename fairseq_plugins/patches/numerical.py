"""NaN/Inf and diverging losses in training.

Behaviours (``FAIRSEQ_PLUGINS_DISABLE_PATCHES`` takes each name, or ``numerical`` for all):

* ``numerical_faults``: naN/Inf in training: one line naming the update, its sentences and where it started.

  fairseq 0.12.2 and 0.12.3.1 (``fairseq-fixed``) handle a non-finite gradient norm in
  ``Trainer.train_step`` by raising ``FloatingPointError`` ("gradients are Nan/Inf", or the loss
  scaler's "Minimum loss scale reached" under ``--fp16``) before the optimizer step, writing
  ``crash.pt``, and re-running the update under ``fairseq.nan_detector.NanDetector`` to log the
  first module whose output is NaN/Inf. Three things go wrong there:

  * the re-run dies: NanDetector puts torch's legacy ``register_backward_hook`` on every
    module, and torch cannot attach it to an output that is a dict of lists (fairseq's
    transformer encoder returns one, and so do the suite's models), so torch raises
    ``StopIteration`` (seen with torch 2.13; torch 2.5 has the same code) and the user gets that
    traceback instead of the FloatingPointError;
  * the batch's sentences are never named, so the data at fault cannot be found;
  * a checkpoint is saved whatever the parameters hold: an optimizer step that overflows
    (``--lr 1e39`` in fp32) writes Inf parameters to ``checkpoint_last.pt`` and the next update fails.

  The patch changes, in fairseq's trainer only:

  * ``fairseq.trainer.NanDetector``: :class:`NanDetector`, fairseq's detector whose backward
    check is a hook on each output tensor (any nesting of dicts, lists and tuples), which
    re-runs the update with the dropout masks of the failed run and never lets a failure of the
    diagnostic re-run replace the original error;
  * ``Trainer.train_step``: the ``FloatingPointError`` becomes :class:`NumericalError`, one line
    with the update number, the sentence ids (``sample["id"]``) of every batch of the update
    (all of ``--update-freq``), the first module the re-run found non-finite, and what is on disk;
  * ``Trainer.save_checkpoint``: refuses to write a checkpoint (other than ``crash.pt``) whose
    parameters are not all finite, so ``checkpoint_last.pt`` always holds finite parameters.

* ``divergence``: ``--on-divergence rollback``: refuse a diverging update, skip its batches, lower the lr, go on.

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

Both change ``Trainer.train_step`` (:data:`TRAIN_STEP`: divergence's rollback around numerical_faults'
report) and ``Trainer.save_checkpoint`` (:data:`~fairseq_plugins.patches._shared.TRAINER_SAVE`).
"""
import dataclasses
import logging
import os
from functools import partial

import torch
from fairseq import nan_detector, trainer as fairseq_trainer
from fairseq.dataclass.configs import OptimizationConfig
from fairseq.dataclass.constants import ChoiceEnum
from fairseq.dataclass.initialize import hydra_init
from fairseq.distributed import utils as distributed_utils
from fairseq.optim.dynamic_loss_scaler import DynamicLossScaler
from fairseq.optim.fairseq_optimizer import FairseqOptimizer
from fairseq.tasks import FairseqTask
from fairseq.trainer import Trainer

from fairseq_plugins.errors import ConfigError, NumericalError
from fairseq_plugins.patches._mechanism import Patch, Target, Wrap, config_options
from fairseq_plugins.patches._shared import LOAD_CHECKPOINT, TRAINER_SAVE

logger = logging.getLogger(__name__)

TRAIN_STEP = Wrap(Target(Trainer, "train_step", "self, samples, raise_oom"), order=["divergence", "numerical_faults"])

# -- numerical_faults --------------------------------------------------------------------------------------------------

DETECTOR = Target(fairseq_trainer, "NanDetector", "model, forward, backward")
# What NanDetector below and its re-run use of fairseq's detector and trainer.
DETECTOR_READS = [Target(Trainer, "_set_seed", "self"),
                  Target(nan_detector.NanDetector, "_detect", "self, tensor, name, backward"),
                  *(Target(nan_detector.NanDetector, name, "self, module, inp, output")
                    for name in ("fhook_fn", "bhook_fn")),
                  *(Target(nan_detector.NanDetector, name, instance=True)
                    for name in ("fhooks", "bhooks", "named_parameters"))]

CRASH_CHECKPOINT = "crash.pt"  # the name fairseq's train_step writes before re-running a failed update
SHOWN_NAMES = 5  # parameter names listed in the log; the rest are counted


class _Diagnosis:
    """What one update's re-run under :class:`NanDetector` found, and what it saved."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.rerun = False
        self.forward = None  # the first non-finite module output: "NaN in the forward output of X (shape ...)"
        self.backward = None  # the first non-finite gradient of a module's output, the same way
        self.bad_gradients = []  # parameters whose gradient is not finite after the re-run
        self.failure = None  # why the re-run itself failed, if it did
        self.crash_checkpoint = None  # the crash.pt written by this update


# The _Diagnosis of the update in progress is kept on the trainer's model for the length of
# the update: fairseq builds its detector as NanDetector(trainer.get_model()), so the model is
# what the detector and the trainer share.
DIAGNOSIS = "_numerical_faults_diagnosis"


def _diagnosis_of(model):
    return vars(model).get(DIAGNOSIS)


def _tensors(output):
    """Every tensor in a module's output: a tensor, or dicts, lists and tuples of them."""
    if torch.is_tensor(output):
        yield output
    elif isinstance(output, dict):
        for value in output.values():
            yield from _tensors(value)
    elif isinstance(output, (list, tuple)):
        for value in output:
            yield from _tensors(value)


def _kind(tensor):
    return "NaN" if torch.isnan(tensor).any() else "Inf"


def _shape(tensor):
    return "x".join(map(str, tensor.shape))


class NanDetector(nan_detector.NanDetector):
    """fairseq's NanDetector, working on every module output and recording what it finds."""

    def __init__(self, model, forward=True, backward=True):
        self.diagnosis = _diagnosis_of(model) or _Diagnosis(None)
        self.diagnosis.rerun = True
        super().__init__(model, forward=forward, backward=backward)

    def __enter__(self):
        if self.diagnosis.trainer is not None:
            self.diagnosis.trainer._set_seed()  # what train_step did first: the same dropout masks
        return self

    def add_hooks(self, module):
        # Only forward hooks: the backward check is a hook on each output tensor (registered in
        # the forward hook), which sees the gradient of that output whatever the output's structure.
        self.fhooks.append(module.register_forward_hook(self._forward_hook))

    def _forward_hook(self, module, inp, output):
        if self.forward:
            first = self.diagnosis.forward is None
            self.fhook_fn(module, inp, output)
            if first and self.diagnosis.forward is not None:
                bad_inputs = [t for t in _tensors(inp) if torch.is_floating_point(t) and not torch.isfinite(t).all()]
                if bad_inputs:  # then NaN/Inf arose outside any module, in the code that called this one
                    self.diagnosis.forward += f", whose input already held {_kind(bad_inputs[0])}"
        if self.backward and torch.is_grad_enabled():
            for tensor in _tensors(output):
                if tensor.requires_grad:
                    self.bhooks.append(tensor.register_hook(partial(self._gradient_hook, module)))

    def _gradient_hook(self, module, grad):
        self.bhook_fn(module, None, grad)  # fairseq's check and warning; the gradient is not changed

    def _detect(self, tensor, name, backward):
        err = super()._detect(tensor, name, backward)
        if err is not None:
            if not backward and self.diagnosis.forward is None:
                self.diagnosis.forward = f"{_kind(tensor)} in the forward output of {name or 'the model'} " \
                                         f"(shape {_shape(tensor)})"
            elif backward and self.diagnosis.backward is None:
                self.diagnosis.backward = f"{_kind(tensor)} in the gradient of the output of {name or 'the model'} " \
                                          f"(shape {_shape(tensor)})"
        return err

    def __exit__(self, exc_type, exc, tb):
        self.diagnosis.bad_gradients = [name for name, p in self.named_parameters
                                        if p.grad is not None and not torch.isfinite(p.grad).all()]
        bad = self.diagnosis.bad_gradients
        if bad:  # (fairseq logs every gradient tensor here)
            more = f" and {len(bad) - SHOWN_NAMES} more" if len(bad) > SHOWN_NAMES else ""
            logger.info("non-finite gradients in %d of %d parameters: %s%s", len(bad), len(self.named_parameters),
                        ", ".join(bad[:SHOWN_NAMES]), more)
        self.close()
        if isinstance(exc, Exception):
            # The re-run is a diagnosis: the trainer re-raises the original FloatingPointError.
            self.diagnosis.failure = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
            logger.warning("re-running the update under NanDetector failed: %s", self.diagnosis.failure)
            return True
        return False


def _non_finite_parameters(model):
    """(name, "NaN" or "Inf") of the parameters holding NaN/Inf, and the number of parameters.

    One device sync when all are finite.
    """
    named = list(model.named_parameters())
    if not named:
        return [], 0
    finite = torch.stack([torch.isfinite(p.detach()).all() for _, p in named]).cpu()
    if bool(finite.all()):
        return [], len(named)
    return [(name, _kind(p.detach())) for (name, p), ok in zip(named, finite.tolist()) if not ok], len(named)


def _first_of(bad, total):
    """``bad``: (name, kind) pairs, e.g. "3 of 45 parameters, the first Inf in encoder.embed_tokens.weight"."""
    name, kind = bad[0]
    return f"{len(bad)} of {total} parameters, the first {kind} in {name}"


def _checkpoint_update(path):
    """The update count stored in checkpoint ``path``, or None where it cannot be read cheaply."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return state["optimizer_history"][-1]["num_updates"]
    except Exception:  # only decorates the message: a file that does not load is named without it
        return None


def _last_checkpoint(trainer):
    cfg = trainer.cfg.checkpoint
    path = os.path.join(cfg.save_dir, f"checkpoint_last{cfg.checkpoint_suffix}.pt")
    if not os.path.exists(path):
        return f"no {os.path.basename(path)} had been saved"
    update = _checkpoint_update(path)
    return f"{path}{'' if update is None else f' (update {update})'} is unchanged"


def _finding(diagnosis):
    """Where the re-run under NanDetector first saw NaN/Inf."""
    if not diagnosis.rerun:
        return None
    if diagnosis.forward is not None:
        found = diagnosis.forward
    elif diagnosis.backward is not None:
        found = diagnosis.backward
    elif diagnosis.bad_gradients:
        found = (f"in no module output or output gradient, but in the gradients of {len(diagnosis.bad_gradients)} "
                 f"parameters, the first {diagnosis.bad_gradients[0]}")
    else:
        found = "none found by the re-run"
    if diagnosis.failure is not None:
        found += f" (the re-run failed: {diagnosis.failure})"
    return found


def _update_report(trainer, samples, error, diagnosis):
    """The one-line message for a FloatingPointError raised by ``train_step``."""
    batches = [s["id"].tolist() for s in samples if s and "id" in s]
    ids = sorted(i for batch in batches for i in batch)
    subset = trainer.cfg.dataset.train_subset
    cause = (str(error).splitlines() or ["NaN/Inf"])[0].rstrip(".")
    parts = [f"update {trainer.get_num_updates() + 1}: {cause}"]
    where = "" if trainer.data_parallel_world_size == 1 else (
        f", on rank {trainer.data_parallel_rank} of {trainer.data_parallel_world_size}")
    parts.append(f"sentence ids of {subset!r}{where}: {ids} ({len(ids)} sentences in {len(batches)} "
                 f"batch{'es' if len(batches) != 1 else ''})")
    finding = _finding(diagnosis)
    if finding is not None:
        parts.append(f"first non-finite value: {finding}")
    bad, total = _non_finite_parameters(trainer.get_model())
    if bad:
        parts.append(f"the parameters held NaN/Inf before this update ({_first_of(bad, total)}), from an "
                     "earlier optimizer step that overflowed (lower --lr) or from the checkpoint training started from")
    saved = [] if diagnosis.crash_checkpoint is None else [f"{diagnosis.crash_checkpoint} holds the state before it"]
    parts.append("this update was not applied: " + ", ".join(saved + [_last_checkpoint(trainer)]))
    return "; ".join(parts)


def train_step(call, self, samples, raise_oom=False):
    """fairseq's ``train_step``; a NaN/Inf ends it with :class:`NumericalError`."""
    model = self.get_model()
    outer = _diagnosis_of(model)  # fairseq's AMP retry calls train_step again from inside train_step
    diagnosis = vars(model)[DIAGNOSIS] = _Diagnosis(self)
    try:
        return call(self, samples, raise_oom)
    except NumericalError:
        raise  # already reported
    except FloatingPointError as error:
        raise NumericalError(_update_report(self, samples, error, diagnosis)) from error
    finally:
        if outer is None:
            del vars(model)[DIAGNOSIS]
        else:
            vars(model)[DIAGNOSIS] = outer


def save_checkpoint(call, self, filename, extra_state):
    """fairseq's ``save_checkpoint``, refusing non-finite parameters (except in ``crash.pt``)."""
    crash = os.path.basename(filename) == CRASH_CHECKPOINT
    if not crash:
        bad, total = _non_finite_parameters(self.get_model())
        if bad:
            raise NumericalError(
                f"update {self.get_num_updates()}: the parameters hold NaN/Inf after its optimizer step "
                f"({_first_of(bad, total)}); {filename} was not written and {_last_checkpoint(self)}; lower --lr")
    result = call(self, filename, extra_state)  # the path on 0.12.3.1, None on 0.12.2
    diagnosis = _diagnosis_of(self.get_model())
    if crash and diagnosis is not None and self.should_save_checkpoint_on_current_rank:
        diagnosis.crash_checkpoint = filename
    return result


# -- divergence --------------------------------------------------------------------------------------------------------

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
CLIP = Target(Trainer, "clip_grad_norm", "self, clip_norm")
# The loss scaler's floor, whose message clip_grad_norm below turns into the rollback's reason.
SCALER_FLOOR = Target(DynamicLossScaler, "check_overflow", "self, grad_norm", holds="Minimum loss scale reached")
TASK_STEP = Target(FairseqTask, "train_step", "self, sample, model, criterion, optimizer, update_num, ignore_grad")
SET_LR = Target(FairseqOptimizer, "set_lr", "self, lr")


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


def rollback_step(call, self, samples, raise_oom=False):
    guard = _guard(self)
    if guard is None:
        return call(self, samples, raise_oom)
    guard.start(self)
    try:
        return call(self, samples, raise_oom)
    except _Diverged as diverged:
        return _roll_back(call, self, guard, samples, diverged)
    finally:
        guard.loss = guard.tokens = None


def _roll_back(call, trainer, guard, samples, diverged):
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
                return call(trainer, samples)
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


def save_divergence_state(call, self, filename, extra_state):
    guard = _guard(self)
    if guard is not None and extra_state is not None:
        extra_state[STATE] = {"lr_scale": guard.lr_scale, "rollbacks": guard.rollbacks}
    return call(self, filename, extra_state)


def load_divergence_state(call, cfg, trainer, **passthrough_args):
    """fairseq's resume; then the lr scale and rollback count of the run it continues."""
    extra_state, epoch_itr = call(cfg, trainer, **passthrough_args)
    state = (extra_state or {}).get(STATE) if isinstance(trainer, Trainer) else None
    guard = _guard(trainer) if state is not None else None
    if guard is not None:
        guard.rollbacks = state["rollbacks"]
        _scale_lr(trainer, guard, state["lr_scale"])
    return extra_state, epoch_itr


PATCHES = [
    Patch("numerical_faults", {DETECTOR: NanDetector}, reads=DETECTOR_READS,
          steps={TRAIN_STEP: train_step, TRAINER_SAVE: save_checkpoint}),
    # requires numerical_faults: a run stopped after --max-rollbacks ends in its report
    Patch("divergence", {**config_options(OptimizationConfig, _Options), CLIP: clip_grad_norm, TASK_STEP: task_train_step,
                         SET_LR: set_lr}, reads=[SCALER_FLOOR], requires=("numerical_faults",),
          steps={TRAIN_STEP: rollback_step, TRAINER_SAVE: save_divergence_state, LOAD_CHECKPOINT: load_divergence_state},
          setup=hydra_init, teardown=hydra_init),
]
