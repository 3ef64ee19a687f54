"""NaN/Inf in training: one line naming the update, its sentences and where it started.

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
"""
import logging
import os
from functools import partial

import torch
from fairseq import nan_detector, trainer as fairseq_trainer
from fairseq.trainer import Trainer

from fairseq_plugins.errors import NumericalError
from fairseq_plugins.patches._mechanism import Patch, Target

DETECTOR = Target(fairseq_trainer, "NanDetector", "model, forward, backward")
TRAIN_STEP = Target(Trainer, "train_step", "self, samples, raise_oom")
SAVE = Target(Trainer, "save_checkpoint", "self, filename, extra_state")

logger = logging.getLogger(__name__)

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


def train_step(self, samples, raise_oom=False):
    """fairseq's ``train_step``; a NaN/Inf ends it with :class:`NumericalError`."""
    model = self.get_model()
    outer = _diagnosis_of(model)  # fairseq's AMP retry calls train_step again from inside train_step
    diagnosis = vars(model)[DIAGNOSIS] = _Diagnosis(self)
    try:
        return TRAIN_STEP(self, samples, raise_oom)
    except NumericalError:
        raise  # already reported
    except FloatingPointError as error:
        raise NumericalError(_update_report(self, samples, error, diagnosis)) from error
    finally:
        if outer is None:
            del vars(model)[DIAGNOSIS]
        else:
            vars(model)[DIAGNOSIS] = outer


def save_checkpoint(self, filename, extra_state):
    """fairseq's ``save_checkpoint``, refusing non-finite parameters (except in ``crash.pt``)."""
    crash = os.path.basename(filename) == CRASH_CHECKPOINT
    if not crash:
        bad, total = _non_finite_parameters(self.get_model())
        if bad:
            raise NumericalError(
                f"update {self.get_num_updates()}: the parameters hold NaN/Inf after its optimizer step "
                f"({_first_of(bad, total)}); {filename} was not written and {_last_checkpoint(self)}; lower --lr")
    result = SAVE(self, filename, extra_state)  # the path on 0.12.3.1, None on 0.12.2
    diagnosis = _diagnosis_of(self.get_model())
    if crash and diagnosis is not None and self.should_save_checkpoint_on_current_rank:
        diagnosis.crash_checkpoint = filename
    return result


PATCH = Patch(__name__, {DETECTOR: NanDetector, TRAIN_STEP: train_step, SAVE: save_checkpoint})
