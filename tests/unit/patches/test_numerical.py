"""patches/numerical.py in process: numerical_faults out and in, the NanDetector fix, and fairseq's fp16 loss
scaling on CPU (``--on-divergence``: tests/unit/patches/test_divergence.py).

The command-line drills (NaN gradients, the sentence that caused them, an optimizer step that
overflows) are in ``test_reliability.py``. Here:

* :class:`fairseq_plugins.patches.numerical.NanDetector` on a model whose submodule returns a
  dict of lists, where fairseq's own detector dies;
* dynamic loss scaling, run by fairseq's own ``Trainer.train_step`` with the ``FP16Optimizer``
  or ``MemoryEfficientFP16Optimizer`` and ``DynamicLossScaler`` the trainer builds from the
  command-line flags, on a suite model in ``.half()`` on CPU, with ``label_smoothed_xent``.

What is not fairseq's normal GPU path, and why (``fairseq-train --fp16 --cpu`` stops at
``AssertionError: Torch not compiled with CUDA enabled``):

* ``--fp16-no-flatten-grads`` (or ``--memory-efficient-fp16``): fairseq's default flat fp32
  copy of the parameters calls ``torch.cuda.current_device()`` and is keyed by CUDA device;
* when an update overflows, ``train_step`` logs a grad norm made with
  ``torch.tensor(0.0).cuda()``; the tests let ``Tensor.cuda`` return the CPU tensor. Nothing
  else is replaced: the scaled backward, the fp16 -> fp32 gradient copy, the overflow check,
  the skipped step, the scale changes and the "Minimum loss scale reached" error are fairseq's.
"""
import logging
import os

import pytest
import torch
from fairseq import nan_detector, options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.optim.dynamic_loss_scaler import DynamicLossScaler
from fairseq.trainer import Trainer
from helpers import first_non_finite_module
from omegaconf import open_dict
from patching import out, tiny

import fairseq_plugins  # noqa: F401  (registers the suite, installs the patches)
from fairseq_plugins.criterions.label_smoothed_xent import LabelSmoothedXentCriterion
from fairseq_plugins.errors import NumericalError
from fairseq_plugins.patches import numerical as numerical_faults


def test_numerical_faults(tiny, tmp_path):
    cfg, task, model, _ = tiny
    with open_dict(cfg):
        cfg.checkpoint.save_dir = str(tmp_path)
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    trainer.consolidate_optimizer()  # as checkpoint_utils.save_checkpoint does first
    weight = next(model.parameters())
    saved = weight.detach().clone()
    try:
        with torch.no_grad():
            weight[0, 0] = float("inf")
        with out("numerical_faults"):
            trainer.save_checkpoint(str(tmp_path / "checkpoint_1.pt"), {})  # fairseq saves Inf parameters
            assert os.path.exists(tmp_path / "checkpoint_1.pt")
        with pytest.raises(NumericalError, match="checkpoint_2.pt was not written"):
            trainer.save_checkpoint(str(tmp_path / "checkpoint_2.pt"), {})
        assert not os.path.exists(tmp_path / "checkpoint_2.pt")
    finally:
        with torch.no_grad():
            weight.copy_(saved)


# ------------------------------------------------------------------ NanDetector on dict outputs


class DictEncoder(torch.nn.Module):
    """Returns what fairseq's transformer encoder returns: a dict of lists of tensors."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x):
        return {"encoder_out": [self.proj(x)], "encoder_padding_mask": []}


class TinyModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = DictEncoder()
        self.out = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.out(self.encoder(x)["encoder_out"][0])


def test_fairseq_nan_detector_dies_on_a_dict_output_and_the_suites_names_the_module():
    model = TinyModel()
    with torch.no_grad():
        model.encoder.proj.weight.fill_(1.0)
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [3e38, 3e38, 3e38, 3e38]])  # proj's output overflows on row 2
    with pytest.raises(StopIteration):  # what fairseq's trainer hit under torch 2.13
        with nan_detector.NanDetector(model):
            model(x).sum().backward()
    model.zero_grad()
    with numerical_faults.NanDetector(model) as detector:
        model(x).sum().backward()
    assert detector.diagnosis.forward == "Inf in the forward output of encoder.proj (shape 2x4)"
    assert detector.diagnosis.failure is None
    assert "out.weight" in detector.diagnosis.bad_gradients  # its gradient is proj's output: Inf
    assert not model.encoder.proj._forward_hooks and not model._forward_hooks  # hooks removed


def test_backward_check_sees_the_gradient_of_a_dict_output():
    """Finite forward, Inf gradient: d sqrt(h)/dh at h = 0, where h is inside the encoder's dict."""
    model = TinyModel()
    with torch.no_grad():
        model.encoder.proj.weight.zero_()
        model.encoder.proj.bias.zero_()
    with numerical_faults.NanDetector(model) as detector:
        torch.sqrt(model.encoder(torch.ones(2, 4))["encoder_out"][0]).sum().backward()
    assert detector.diagnosis.forward is None
    assert detector.diagnosis.backward == "Inf in the gradient of the output of encoder.proj (shape 2x4)"


def test_a_failing_rerun_never_replaces_the_original_error():
    model = TinyModel()
    with pytest.raises(FloatingPointError, match="gradients are Nan/Inf"):
        try:
            raise FloatingPointError("gradients are Nan/Inf")
        except FloatingPointError:  # the trainer's handler: re-run under the detector, then re-raise
            with numerical_faults.NanDetector(model) as detector:
                raise RuntimeError("the re-run broke\nsecond line")
            raise
    assert detector.diagnosis.failure == "RuntimeError: the re-run broke"


# ------------------------------------------------------------------ fp16 loss scaling (fairseq's Trainer, CPU)

FP16_OPTIMIZERS = {"FP16Optimizer": ["--fp16-no-flatten-grads"],
                   "MemoryEfficientFP16Optimizer": ["--memory-efficient-fp16"]}
FP16_CASES = [(arch, optimizer) for arch in ("vaswani_transformer_tiny", "rnnsearch_tiny") for optimizer in FP16_OPTIMIZERS]


@pytest.fixture
def cpu_cuda_call(monkeypatch):
    """``torch.tensor(0.0).cuda()`` in train_step's overflow handler: the CPU tensor (see the module docstring)."""
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *args, **kwargs: self)


def training_setup(data_bin, save_dir, arch, *flags):
    """fairseq-train's configuration and task from its flags (on CPU), and one batch of 16 sentences."""
    args = options.parse_args_and_arch(options.get_training_parser(), [
        data_bin, "--arch", arch, "--criterion", "label_smoothed_xent", "--optimizer", "adam", "--lr", "1e-3",
        "--cpu", "--seed", "1", "--save-dir", str(save_dir), *map(str, flags)])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    dataset = task.dataset("train")
    return cfg, task, dataset.collater([dataset[i] for i in range(16)])


def fp16_trainer(data_bin, save_dir, arch, optimizer, *flags, weight_scale=1.0):
    """fairseq's Trainer built from fairseq-train's flags (--fp16 on CPU), and one batch of 16 sentences."""
    cfg, task, sample = training_setup(data_bin, save_dir, arch, "--fp16", *FP16_OPTIMIZERS[optimizer], *flags)
    model = task.build_model(cfg.model)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(weight_scale)
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    assert type(trainer.optimizer).__name__ == optimizer
    assert type(trainer.optimizer.scaler) is DynamicLossScaler
    assert isinstance(trainer.criterion, LabelSmoothedXentCriterion)
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float16}
    return trainer, sample


def snapshot(trainer):
    """The fp16 model's parameters and, for FP16Optimizer, its fp32 master copy."""
    tensors = list(trainer.model.parameters()) + list(getattr(trainer.optimizer, "fp32_params", []))
    return [t.detach().clone() for t in tensors]


def same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("arch, optimizer", FP16_CASES)
def test_fp16_overflow_lowers_the_loss_scale_skips_the_update_and_training_goes_on(
        data_bin, tmp_path, caplog, cpu_cuda_call, arch, optimizer):
    """Initial scale 2**20: every scaled gradient overflows fp16 (max 65504) until the scale is low enough.

    Then updates apply, and after --fp16-scale-window 2 clean updates the scaler doubles the scale again.
    """
    trainer, sample = fp16_trainer(data_bin, tmp_path, arch, optimizer, "--fp16-init-scale", str(2 ** 20),
                                   "--fp16-scale-window", "2")
    scaler = trainer.optimizer.scaler
    caplog.set_level(logging.INFO, logger="fairseq.trainer")
    steps = []
    for _ in range(16):
        before, scale, updates = snapshot(trainer), scaler.loss_scale, trainer.get_num_updates()
        caplog.clear()
        trainer.train_step([sample])
        overflow = "gradient overflow detected, ignoring gradient" in caplog.text
        if overflow:
            assert f"setting loss scale to: {scale / 2}" in caplog.text
            assert scaler.loss_scale == scale / 2
            assert same(snapshot(trainer), before), "an overflowing update changed the parameters"
            assert trainer.get_num_updates() == updates
        else:
            assert scaler.loss_scale in (scale, 2 * scale)
            assert not same(snapshot(trainer), before), "a clean update left the parameters unchanged"
            assert trainer.get_num_updates() == updates + 1
            assert all(torch.isfinite(t).all() for t in snapshot(trainer))
        steps.append((scale, scaler.loss_scale, overflow))
    assert steps[0] == (2 ** 20, 2 ** 19, True)
    first_update = next(i for i, (_, _, overflow) in enumerate(steps) if not overflow)  # training went on
    assert steps[first_update][0] < 2 ** 15, steps
    assert any(after == 2 * scale and not overflow for scale, after, overflow in steps), steps  # scale grew back
    assert trainer.get_num_updates() >= 3, steps


@pytest.mark.parametrize("arch, optimizer", FP16_CASES)
def test_fp16_persistent_overflow_ends_with_minimum_loss_scale_reached(data_bin, tmp_path, caplog, cpu_cuda_call,
                                                                       arch, optimizer):
    """Weights x 1e4: finite in fp16, but their products overflow it, so no loss scale helps.

    Scale 4 -> 2 -> 1 (two skipped updates), then 0.5 reaches --min-loss-scale 0.5: fairseq's
    FloatingPointError, reported by the suite with the batch and the module that overflowed.
    """
    trainer, sample = fp16_trainer(data_bin, tmp_path, arch, optimizer, "--fp16-init-scale", "4",
                                   "--min-loss-scale", "0.5", weight_scale=1e4)
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())  # the weights themselves fit fp16
    scaler, start = trainer.optimizer.scaler, snapshot(trainer)
    caplog.set_level(logging.INFO, logger="fairseq.trainer")
    for scale in (2.0, 1.0):
        trainer.train_step([sample])
        assert scaler.loss_scale == scale and f"setting loss scale to: {scale}" in caplog.text
    with pytest.raises(NumericalError) as error:
        trainer.train_step([sample])
    assert isinstance(error.value, FloatingPointError)
    assert str(error.value.__cause__) == ("Minimum loss scale reached (0.5). Your loss is probably exploding. Try "
                                          "lowering the learning rate, using gradient clipping or increasing the "
                                          "batch size.")
    prepared, _ = trainer._prepare_sample(sample)  # as train_step feeds it (fp16 inputs)
    trainer.model.train()
    trainer._set_seed()  # the dropout masks of the failed update
    module = first_non_finite_module(trainer.model, prepared["net_input"])
    message = str(error.value)
    assert message.startswith("update 1: Minimum loss scale reached (0.5). Your loss is probably exploding. Try "
                              "lowering the learning rate, using gradient clipping or increasing the batch size; "
                              f"sentence ids of 'train': {list(range(16))} (16 sentences in 1 batch); "
                              f"first non-finite value: Inf in the forward output of {module} (shape "), message
    assert message.endswith(f"this update was not applied: {tmp_path}/crash.pt holds the state before it, "
                            "no checkpoint_last.pt had been saved"), message
    assert "\n" not in message
    assert scaler.loss_scale == 1.0  # fairseq keeps the last scale above the minimum
    assert same(snapshot(trainer), start) and trainer.get_num_updates() == 0
    assert (tmp_path / "crash.pt").exists()


# ------------------------------------------------------------------ the detector's and the report's details


class Scale(torch.nn.Module):
    """A module with no submodule whose output is a dict: only the dict's own tensor can be hooked."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(4))

    def forward(self, x):
        return {"encoder_out": [x * self.weight]}


class Pair(torch.nn.Module):
    def forward(self, a, b):
        return a + b


def test_the_gradient_of_a_tensor_only_a_dict_output_holds_is_checked():
    model = torch.nn.Module()
    model.encoder = Scale()
    with numerical_faults.NanDetector(model) as detector:
        torch.sqrt(model.encoder(torch.ones(2, 4))["encoder_out"][0]).sum().backward()  # d sqrt(h)/dh at 0
    assert detector.diagnosis.backward == "Inf in the gradient of the output of encoder (shape 2x4)"
    with numerical_faults.NanDetector(model, backward=False) as detector:  # fairseq's flag: forward only
        torch.sqrt(model.encoder(torch.ones(2, 4))["encoder_out"][0]).sum().backward()
    assert detector.diagnosis.backward is None and not detector.bhooks


def test_a_non_finite_value_made_outside_any_module_is_said_to_be_in_the_input():
    model = torch.nn.Module()
    model.pair = Pair()
    a = torch.tensor([float("nan"), 1.0])
    b = torch.tensor([1.0, float("inf")])
    with numerical_faults.NanDetector(model, backward=False) as detector:
        model.pair(a, b)
    assert detector.diagnosis.forward == "NaN in the forward output of pair (shape 2), whose input already held NaN"
    model = torch.nn.Module()
    model.pair = Pair()
    with numerical_faults.NanDetector(model, backward=False) as detector:
        model.pair(torch.tensor([3e38, 1.0]), torch.tensor([3e38, 1.0]))  # finite inputs: the module made the Inf
    assert detector.diagnosis.forward == "Inf in the forward output of pair (shape 2)"


@pytest.mark.parametrize("bad, listed", [(11, "p0, p1, p2, p3, p4 and 6 more"), (7, "p0, p1, p2, p3, p4 and 2 more"),
                                         (5, "p0, p1, p2, p3, p4"), (2, "p0, p1"), (0, None)])
def test_the_log_lists_five_parameters_with_non_finite_gradients_and_counts_the_rest(caplog, bad, listed):
    model = torch.nn.Module()
    for i in range(12):
        model.register_parameter(f"p{i}", torch.nn.Parameter(torch.ones(1)))
    with caplog.at_level(logging.INFO, logger=numerical_faults.__name__):
        with numerical_faults.NanDetector(model):
            for i, p in enumerate(model.parameters()):
                p.grad = torch.full((1,), float("inf") if i < bad else 1.0)
    if listed is None:
        assert "non-finite gradients" not in caplog.text
    else:
        assert f"non-finite gradients in {bad} of 12 parameters: {listed}\n" in caplog.text + "\n"


def test_an_interrupt_during_the_rerun_is_not_swallowed():
    with pytest.raises(KeyboardInterrupt):
        with numerical_faults.NanDetector(TinyModel()):
            raise KeyboardInterrupt


def test_train_step_keeps_fairseqs_signature():
    import inspect

    step = inspect.signature(numerical_faults.train_step)
    assert step.replace(parameters=list(step.parameters.values())[1:]) == inspect.signature(
        numerical_faults.TRAIN_STEP.target.original)  # its step's, after the next step it calls
    from fairseq.trainer import Trainer
    assert inspect.signature(Trainer.train_step) == inspect.signature(numerical_faults.TRAIN_STEP.target.original)


@pytest.fixture
def trainer(data_bin, tmp_path):
    cfg, task, sample = training_setup(data_bin, tmp_path / "save", "vaswani_transformer_tiny")
    (tmp_path / "save").mkdir()
    model = task.build_model(cfg.model)
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    trainer.consolidate_optimizer()  # what fairseq's checkpoint_utils.save_checkpoint calls first
    return trainer, sample


def test_a_checkpoint_of_non_finite_parameters_is_refused_but_crash_pt_is_written(trainer):
    trainer, _ = trainer
    save = trainer.cfg.checkpoint.save_dir
    last, crash = f"{save}/checkpoint_last.pt", f"{save}/crash.pt"
    weight = dict(trainer.model.named_parameters())["encoder.embed_tokens.weight"]
    total = len(list(trainer.model.parameters()))
    trainer.save_checkpoint(last, {})  # finite: written
    with torch.no_grad():
        weight[0, 0] = float("inf")
        dict(trainer.model.named_parameters())["decoder.layers.0.fc2.bias"][0] = float("nan")
    with pytest.raises(NumericalError) as refused:
        trainer.save_checkpoint(f"{save}/checkpoint_1_1.pt", {})
    assert str(refused.value) == (
        f"update 0: the parameters hold NaN/Inf after its optimizer step (2 of {total} parameters, the first Inf "
        f"in encoder.embed_tokens.weight); {save}/checkpoint_1_1.pt was not written and {last} (update 0) is "
        "unchanged; lower --lr")
    trainer.save_checkpoint(crash, {})  # the state before a failed update, whatever it holds
    assert torch.isinf(torch.load(crash, weights_only=False)["model"]["encoder.embed_tokens.weight"][0, 0])
    os.remove(last)
    with pytest.raises(NumericalError, match=r"was not written and no checkpoint_last\.pt had been saved; lower"):
        trainer.save_checkpoint(last, {})


def test_the_report_names_the_cause_the_sentences_and_the_batches(trainer, monkeypatch):
    trainer, _ = trainer
    error = FloatingPointError("gradients are Nan/Inf.\nsecond line")
    ids = lambda *batches: [{"id": torch.tensor(b)} for b in batches]  # noqa: E731
    report = lambda samples: numerical_faults._update_report(  # noqa: E731
        trainer, samples, error, numerical_faults._Diagnosis(trainer))
    assert report(ids([4, 2])).startswith(
        "update 1: gradients are Nan/Inf; sentence ids of 'train': [2, 4] (2 sentences in 1 batch); this update")
    assert "sentence ids of 'train': [1, 2, 4] (3 sentences in 2 batches);" in report(ids([4, 2], [1]))
    assert "sentence ids of 'train': [] (0 sentences in 0 batches);" in report([{}])
    assert "sentence ids of 'train': [3] (1 sentences in 1 batch);" in report([{"ntokens": 0}, {"id": torch.tensor([3])}])
    monkeypatch.setattr(Trainer, "data_parallel_world_size", property(lambda self: 2))
    monkeypatch.setattr(Trainer, "data_parallel_rank", property(lambda self: 1))
    assert "sentence ids of 'train', on rank 1 of 2: [2, 4] (2 sentences in 1 batch);" in report(ids([4, 2]))


def test_an_update_leaves_no_diagnosis_behind(trainer):
    trainer, sample = trainer
    trainer.train_step([sample])
    assert numerical_faults.DIAGNOSIS not in vars(trainer.get_model())


def test_the_last_checkpoints_update_is_its_last_history_entry(tmp_path):
    path = tmp_path / "checkpoint_last.pt"
    torch.save({"optimizer_history": [{"num_updates": n} for n in (2, 5, 9)]}, path)  # resumed twice
    assert numerical_faults._checkpoint_update(str(path)) == 9
    path.write_bytes(b"not a checkpoint")
    assert numerical_faults._checkpoint_update(str(path)) is None
    marker = tmp_path / "CODE_WAS_RUN"
    torch.save({"optimizer_history": [{"num_updates": RunsCode(marker)}]}, path)
    assert numerical_faults._checkpoint_update(str(path)) is None  # read weights-only, for a message
    assert not marker.exists()


class RunsCode:
    """Unpickled, it would create ``path``."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_a_finding_only_in_parameter_gradients_names_the_first():
    diagnosis = numerical_faults._Diagnosis(None)
    assert numerical_faults._finding(diagnosis) is None  # no re-run: nothing to say
    diagnosis.rerun, diagnosis.bad_gradients = True, ["encoder.w", "decoder.w"]
    diagnosis.failure = "RuntimeError: broke"
    assert numerical_faults._finding(diagnosis) == ("in no module output or output gradient, but in the gradients of 2 "
                                                    "parameters, the first encoder.w (the re-run failed: RuntimeError: broke)")
