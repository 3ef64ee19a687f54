"""--on-divergence (patches/numerical.py, divergence): a poisoned batch is skipped, or stops the run as before.

The poison is test-only (tests/train_probe.py, PROBE_POISON=i): while the trainer works on the
update holding sentence i, the encoder's token embedding outputs Inf. The oracle of a rollback is
a run on the data without that update (PROBE_DROP=i: the probe never trains it) whose learning
rate is multiplied by --divergence-lr-factor from that update on (the documented change, applied
to the reference by restarting it there with --lr 0.002 x 0.5).
"""
import logging
import os
import re
import signal
import sys
from types import SimpleNamespace

import pytest
import torch
from fairseq.trainer import Trainer
from helpers import ONE_THREAD, REPO, USER_DIR, num_updates, slurm_tasks
from omegaconf import open_dict

from test_numerical import cpu_cuda_call, fp16_trainer, same, snapshot, training_setup  # noqa: F401  (a fixture)

from fairseq_plugins.checkpoints import load_state
from fairseq_plugins.errors import ConfigError, NumericalError
from fairseq_plugins.patches import numerical as divergence
from fairseq_plugins.patches.numerical import _Guard

PROBE = os.path.join(REPO, "tests", "train_probe.py")
POISON = "5"  # a sentence id
WARMUP, WINDOW = 10, 100  # the loss rule's documented constants (docs/RELIABILITY.md)
TOTAL = 6


def flags(data, save_dir, updates=TOTAL, lr=0.002):
    return [data, "--user-dir", USER_DIR, "--arch", "vaswani_transformer_tiny", "--dropout", "0",
            "--criterion", "label_smoothed_xent", "--optimizer", "adam", "--lr", str(lr), "--max-tokens", "600",
            "--max-update", str(updates), "--seed", "1", "--save-dir", save_dir, "--disable-validation",
            "--no-progress-bar", "--log-interval", "1", "--num-workers", "0", "--cpu", "--no-epoch-checkpoints"]


def train(args, workers=1, env=None):
    """[(exit status, output)] of ``workers`` SLURM tasks (or one plain process) of the probe."""
    # PYTHONFAULTHANDLER: a worker that aborts (SIGABRT, seen once under load at a two-worker run's
    # exit) prints every thread's Python stack, so its output says where
    return slurm_tasks([sys.executable, PROBE, *args], workers,
                       {**ONE_THREAD, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1", **(env or {})})


ROLLED_BACK = re.compile(r"update (\d+): the gradient norm is not finite; rolled back: the update is not applied "
                         r"\(the model and optimizer are those of update (\d+)\), its batches are skipped \(sentence ids "
                         r"on rank (\d): \[([\d, ]*)\]\), lr 0\.002 -> 0\.001 \(--divergence-lr-factor 0\.5\); "
                         r"rollback 1 of --max-rollbacks 5$", re.M)


# ------------------------------------------------------------------ fp16's loss-scale floor (fairseq's Trainer, CPU)

@pytest.mark.parametrize("optimizer", ["FP16Optimizer", "MemoryEfficientFP16Optimizer"])
def test_the_fp16_loss_scale_floor_rolls_back_until_max_rollbacks_then_stops_with_the_usual_report(
        data_bin, tmp_path, caplog, cpu_cuda_call, optimizer):
    """tests/unit/patches/test_numerical.py's persistent overflow (weights x 1e4: scale 4 -> 2 -> 1, then the
    floor): with rollback and --max-rollbacks 2, the floor twice rolls back (nothing applied, lr
    halved each time, and still when the scheduler sets it again), the third time ends with the report of a
    run without rollback."""
    trainer, sample = fp16_trainer(data_bin, tmp_path, "vaswani_transformer_tiny", optimizer, "--fp16-init-scale", "4",
                                   "--min-loss-scale", "0.5", "--on-divergence", "rollback", "--max-rollbacks", "2",
                                   weight_scale=1e4)
    start = snapshot(trainer)
    caplog.set_level(logging.INFO)
    for _ in range(2):  # fairseq's own overflow skips
        trainer.train_step([sample])
    for rollback, lr in ((1, 5e-4), (2, 2.5e-4)):
        caplog.clear()
        assert trainer.train_step([sample]) is None
        assert (f"update 1: Minimum loss scale reached (0.5); rolled back: the update is not applied (the model and "
                f"optimizer are those of update 0), its batches are skipped (sentence ids on rank 0: "
                f"{list(range(16))}), lr {lr * 2:g} -> {lr:g} (--divergence-lr-factor 0.5); rollback {rollback} of "
                f"--max-rollbacks 2") in caplog.messages
        assert trainer.get_lr() == lr and same(snapshot(trainer), start) and trainer.get_num_updates() == 0
    trainer.lr_step_begin_epoch(2)  # the scheduler sets the lr anew through the fp16 wrapper: the scale holds
    assert trainer.get_lr() == 2.5e-4
    with pytest.raises(NumericalError) as error:
        trainer.train_step([sample])
    assert str(error.value).startswith("update 1: Minimum loss scale reached (0.5). Your loss is probably exploding.")
    assert same(snapshot(trainer), start)


# ------------------------------------------------------------------ the loss-spike rule (patches/numerical.py's _Guard)

def test_a_loss_above_the_factor_times_its_running_mean_is_a_divergence_once_warmed_up():
    """The rule recomputed by hand: the mean of the accepted losses per token, compared from the
    WARMUP-th accepted update on; a refused loss does not enter the mean; factor 0 turns it off, any
    positive one is taken."""
    trainer = SimpleNamespace(device=torch.device("cpu"), data_parallel_world_size=1, optimizer=SimpleNamespace())
    finite = torch.tensor(1.0)

    def check(guard, loss_per_token, tokens=40):  # an update of two batches (--update-freq 2), 10 and 30 tokens
        guard.start(trainer)
        for part in (tokens // 4, tokens - tokens // 4):
            guard.add(loss_per_token * part, part)
        return guard.check(trainer, finite)

    guard = _Guard(SimpleNamespace(divergence_factor=5.0, divergence_lr_factor=0.5, max_rollbacks=5))
    for _ in range(WARMUP - 1):
        assert check(guard, 1.0) is None
    assert check(guard, 100.0) is None  # 100 x the mean, but only WARMUP - 1 updates were accepted before it
    mean = (100.0 + (WARMUP - 1) * 1.0) / WARMUP  # 10.9
    assert check(guard, 5 * mean + 0.01) == (f"the loss per token {5 * mean + 0.01:.4g} is above 5 x its running "
                                            f"mean {mean:.4g}")
    # an update of one token (e.g. one sentence under --sentence-avg): its loss is per that one
    reason = check(guard, 5 * mean + 0.01, tokens=1)
    assert reason and reason.startswith(f"the loss per token {5 * mean + 0.01:.4g} "), reason
    assert check(guard, 5 * mean - 0.01) is None  # the refused losses left the mean alone
    assert check(guard, float("inf")) == "the loss is not finite"
    assert check(guard, float("nan")) == "the loss is not finite"  # with a finite gradient norm
    assert guard.check(trainer, torch.tensor(float("nan"))) == "the gradient norm is not finite"

    at = _Guard(SimpleNamespace(divergence_factor=5.0, divergence_lr_factor=0.5, max_rollbacks=5))
    for _ in range(WARMUP):
        assert check(at, 1.0) is None  # a mean of exactly 1
    assert check(at, 5.0) is None  # "above": exactly 5 x the mean is accepted

    off = _Guard(SimpleNamespace(divergence_factor=0.0, divergence_lr_factor=0.5, max_rollbacks=5))
    for loss in [1.0] * WARMUP + [1e6]:
        assert check(off, loss) is None

    strict = _Guard(SimpleNamespace(divergence_factor=1.0, divergence_lr_factor=0.5, max_rollbacks=5))  # 1: any rise
    for _ in range(WARMUP):
        assert check(strict, 1.0) is None
    assert check(strict, 1.5) == "the loss per token 1.5 is above 1 x its running mean 1"


def test_the_running_mean_averages_the_first_100_losses_then_forgets_at_that_span():
    """100 accepted losses of 1 per token, then 50 of 2: the mean is 1, then the exponential one of
    span 100 (each update weighs 1/100), 2 - 0.99**50 = 1.395; a loss just above 5 x that is refused."""
    trainer = SimpleNamespace(device=torch.device("cpu"), data_parallel_world_size=1)
    guard = _Guard(SimpleNamespace(divergence_factor=5.0, divergence_lr_factor=0.5, max_rollbacks=5))
    mean = 0.0
    for n, loss in enumerate([1.0] * WINDOW + [2.0] * 50, start=1):
        guard.loss, guard.tokens = loss * 40, 40
        assert guard.check(trainer, torch.tensor(1.0)) is None
        mean = mean + (loss - mean) / n if n <= WINDOW else 0.99 * mean + 0.01 * loss
    assert round(mean, 3) == 1.395
    guard.loss, guard.tokens = 5 * mean * 40 + 0.4, 40
    assert guard.check(trainer, torch.tensor(1.0)).endswith(f"above 5 x its running mean {mean:.4g}")


def test_the_defaults_are_the_documented_ones(data_bin, tmp_path):
    """docs/RELIABILITY.md's table: stop; factor 5, lr factor 0.5, 5 rollbacks (fairseq-train's parser)."""
    cfg, _, _ = training_setup(data_bin, tmp_path, "vaswani_transformer_tiny")
    optimization = cfg.optimization
    assert (optimization.on_divergence, optimization.divergence_factor, optimization.divergence_lr_factor,
            optimization.max_rollbacks) == ("stop", 5.0, 0.5, 5)


def test_the_guard_sums_the_batches_of_an_update_but_not_fairseqs_dummy_batches(monkeypatch):
    """The task's train_step (fairseq's, a stand-in here) feeds the guard each batch's summed loss
    and sample size; a dummy batch (ignore_grad: fairseq's stand-in for a worker out of data)
    adds nothing, and outside an update (no start) nothing is summed."""
    monkeypatch.setattr(divergence, "TASK_STEP", lambda task, sample, model, criterion, optimizer, update_num,
                        ignore_grad: (None, sample["n"], {"loss": 2.0 * sample["n"]}))
    guard = _Guard(SimpleNamespace(divergence_factor=5.0, divergence_lr_factor=0.5, max_rollbacks=5))
    criterion = SimpleNamespace(**{divergence.GUARD: guard})
    divergence.task_train_step(None, {"n": 7}, None, criterion, None, 1, False)  # before the update began
    guard.start(SimpleNamespace(optimizer=SimpleNamespace()))
    for n, dummy in ((10, False), (30, False), (50, True)):
        assert divergence.task_train_step(None, {"n": n}, None, criterion, None, 1, dummy) == (None, n, {"loss": 2.0 * n})
    assert (guard.loss, guard.tokens) == (80.0, 40)
    # a criterion of the user's that logs no "loss": nothing is added to the loss, so the loss rule never
    # fires on it (a made-up loss per batch, divided by the tokens, would spike on a short update)
    monkeypatch.setattr(divergence, "TASK_STEP", lambda task, sample, model, criterion, optimizer, update_num,
                        ignore_grad: (None, sample["n"], {"nll_loss": 1.0}))
    divergence.task_train_step(None, {"n": 5}, None, criterion, None, 1, False)
    assert (guard.loss, guard.tokens) == (80.0, 45)


def test_the_guard_is_back_on_after_fairseqs_own_run_of_an_update_past_max_rollbacks():
    """Past --max-rollbacks, a divergence fairseq stops on is run again as fairseq runs it (the guard
    off, for fairseq's own report); if that run goes through (the divergence did not recur), the
    guard is on again for the next update."""
    guard = _Guard(SimpleNamespace(divergence_factor=5.0, divergence_lr_factor=0.5, max_rollbacks=0))
    trainer = SimpleNamespace(criterion=SimpleNamespace(**{divergence.GUARD: guard}), zero_grad=lambda: None,
                              get_num_updates=lambda: 3, data_parallel_rank=0)
    during = []
    fairseqs = lambda trainer, samples: during.append(divergence._guard(trainer))  # noqa: E731
    divergence._roll_back(fairseqs, trainer, guard, [], divergence._Diverged("the gradient norm is not finite", True))
    assert during == [None] and divergence._guard(trainer) is guard


def test_a_run_resumed_with_fewer_max_rollbacks_than_it_used_stops_at_its_next_divergence():
    """3 rollbacks restored from the checkpoint, resumed with --max-rollbacks 2: the next divergence
    stops the run (it is past the limit, not only at it), nothing rolled back, the lr as it was."""
    guard = _Guard(SimpleNamespace(divergence_factor=5.0, divergence_lr_factor=0.5, max_rollbacks=2))
    guard.rollbacks, guard.lr_scale = 3, 0.125  # as load_checkpoint restores them
    trainer = SimpleNamespace(zero_grad=lambda: None, get_num_updates=lambda: 7, data_parallel_rank=0)
    with pytest.raises(NumericalError, match=r"^update 8: the loss per token 9 is above 5 x its running mean 1; "
                                             r"stopped after --max-rollbacks 2 rollbacks \(sentence ids on rank 0: "
                                             r"\[3, 4\]\)$"):
        divergence._roll_back(None, trainer, guard, [{"id": torch.tensor([4, 3])}, {}],
                              divergence._Diverged("the loss per token 9 is above 5 x its running mean 1", False))
    assert (guard.rollbacks, guard.lr_scale) == (3, 0.125)


def test_every_worker_takes_the_decision_on_the_loss_summed_over_the_workers(monkeypatch):
    """Two workers (the other's sums added by a stand-in for fairseq's all-reduce): the loss per
    token compared is the global one, so both workers refuse, or accept, the same update."""
    trainer = SimpleNamespace(device=torch.device("cpu"), data_parallel_world_size=2, data_parallel_process_group=None)
    other = torch.tensor([4000.0, 40.0], dtype=torch.float64)  # the other worker: 100 per token
    reduced = []
    monkeypatch.setattr(divergence.distributed_utils, "all_reduce",
                        lambda tensor, group: reduced.append(tensor.add_(other)))
    guard = _Guard(SimpleNamespace(divergence_factor=5.0, divergence_lr_factor=0.5, max_rollbacks=5))
    for _ in range(WARMUP):
        guard.loss, guard.tokens = 40.0, 40  # this worker: 1 per token, so 50.5 per token in all
        assert guard.check(trainer, torch.tensor(1.0)) is None
    guard.loss, guard.tokens = 40.0 * 20, 40  # 20 per token: above 5 x this worker's own mean 1; 60 in all
    assert guard.check(trainer, torch.tensor(1.0)) is None
    guard.loss, guard.tokens, other[0] = 40.0, 40, 40000.0  # 1 per token here; (40 + 40000) / 80 = 500.5 in all
    assert guard.check(trainer, torch.tensor(1.0)).startswith("the loss per token 500.5 is above 5 x its running mean")
    assert len(reduced) == WARMUP + 2


def test_a_loss_spike_past_max_rollbacks_stops_the_run_with_nothing_applied(data_bin, tmp_path):
    """The loss rule is the suite's own (fairseq would step such an update): past --max-rollbacks its
    divergence stops the run with the reason, the update not applied, instead of being run as
    fairseq runs it."""
    cfg, task, sample = training_setup(data_bin, tmp_path, "vaswani_transformer_tiny", "--on-divergence", "rollback",
                                       "--max-rollbacks", "0")
    trainer = Trainer(cfg, task, task.build_model(cfg.model), task.build_criterion(cfg.criterion))
    assert trainer.train_step([sample]) is not None
    guard = divergence._guard(trainer)
    guard.accepted, guard.mean = WARMUP, 1e-3  # a history of tiny losses: this sample's is a spike
    start = snapshot(trainer)
    with pytest.raises(NumericalError) as error:
        trainer.train_step([sample])
    assert re.match(r"update 2: the loss per token \S+ is above 5 x its running mean 0\.001; stopped after "
                    r"--max-rollbacks 0 rollbacks \(sentence ids on rank 0: \[0, ", str(error.value)), str(error.value)
    assert same(snapshot(trainer), start) and trainer.get_num_updates() == 1


@pytest.mark.parametrize("on_divergence", ["stop", "rollback"])
def test_an_out_of_memory_batch_is_skipped_as_fairseq_skips_it(data_bin, tmp_path, monkeypatch, on_divergence):
    """fairseq-train calls train_step(samples): an out-of-memory error in the batch is logged and the
    batch skipped (fairseq's raise_oom=False), not raised; the next batch trains."""
    cfg, task, sample = training_setup(data_bin, tmp_path, "vaswani_transformer_tiny", "--on-divergence", on_divergence)
    trainer = Trainer(cfg, task, task.build_model(cfg.model), task.build_criterion(cfg.criterion))
    task_step, calls = divergence.TASK_STEP, []

    def out_of_memory_once(*args):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("CUDA out of memory (a stand-in)")
        return task_step(*args)

    monkeypatch.setattr(divergence, "TASK_STEP", out_of_memory_once)
    assert trainer.train_step([sample]) is None and trainer.get_num_updates() == 0
    assert trainer.train_step([sample]) is not None and trainer.get_num_updates() == 1


@pytest.mark.parametrize("flags, error", [
    (["--divergence-factor", -1], "--divergence-factor -1: must be 0 (off) or positive"),
    (["--divergence-lr-factor", 0], "--divergence-lr-factor 0: must be in (0, 1]"),
    (["--divergence-lr-factor", -0.5], "--divergence-lr-factor -0.5: must be in (0, 1]"),  # lr sign flipped
    (["--divergence-lr-factor", 1.5], "--divergence-lr-factor 1.5: must be in (0, 1]"),
    (["--max-rollbacks", -1], "--max-rollbacks -1: must be 0 or more"),
    (["--on-divergence", "skip"], "--on-divergence skip: must be stop or rollback"),  # a config file's value
    (["--divergence-factor", 0, "--divergence-lr-factor", 1, "--max-rollbacks", 0], None),  # the edges are taken
])
def test_option_values_are_checked_at_the_first_update(data_bin, tmp_path, flags, error):
    """With --on-divergence rollback, a value out of range is one ConfigError naming the flag and
    the value, before anything is trained; the edges of each range train."""
    choice = flags[1] if flags[0] == "--on-divergence" else None
    cfg, task, sample = training_setup(data_bin, tmp_path, "vaswani_transformer_tiny", "--on-divergence", "rollback",
                                     *([] if choice else flags))
    if choice:  # argparse allows only the choices; a config file or fairseq_cli.train.main(cfg) may hold any
        with open_dict(cfg):
            cfg.optimization.on_divergence = choice
    trainer = Trainer(cfg, task, task.build_model(cfg.model), task.build_criterion(cfg.criterion))
    if error is None:
        assert trainer.train_step([sample]) is not None and trainer.get_num_updates() == 1
        return
    with pytest.raises(ConfigError) as raised:
        trainer.train_step([sample])
    assert str(raised.value) == error and trainer.get_num_updates() == 0


# ------------------------------------------------------------------ end to end (slow, so last: pytest -x stops earlier)

@pytest.mark.slow
def test_two_workers_roll_back_a_poisoned_update_and_end_as_a_run_without_it(data_bin, tmp_path):
    """2 workers x --update-freq 1 with --on-divergence rollback; the reference is 1 process x
    --update-freq 2 (the same global batches, bit-equal: tests/integration/test_cluster.py) that never trains
    the update holding the poisoned sentence, with lr 0.001 from that update on: bit-equal weights
    (0.002 x 0.5 is exactly 0.001 in binary floating point). Then the rolled-back run killed after
    the rollback and resumed (the lr scale from its checkpoint) ends bit-equal to the run not killed."""
    save = str(tmp_path / "rollback")
    runs = train([*flags(data_bin, save), "--on-divergence", "rollback"], workers=2, env={"PROBE_POISON": POISON})
    assert [code for code, _ in runs] == [0, 0], runs[0][1][-3000:] + runs[1][1][-3000:]
    found = [ROLLED_BACK.findall(out) for _, out in runs]
    assert [len(f) for f in found] == [1, 1], runs[0][1][-3000:]
    (update, before, rank0, ids0), (update1, _, rank1, ids1) = found[0][0], found[1][0]
    assert update == update1 and int(before) == int(update) - 1 and (rank0, rank1) == ("0", "1")
    assert POISON in (ids0 + ", " + ids1).split(", ")  # the skipped update held the poison
    update = int(update)
    assert 1 < update < TOTAL

    reference = str(tmp_path / "reference")
    drop = {"PROBE_DROP": POISON}
    assert train([*flags(data_bin, reference, updates=update - 1), "--update-freq", 2], env=drop)[0][0] == 0
    code, out = train([*flags(data_bin, reference, lr=0.001), "--update-freq", 2], env=drop)[0]
    assert code == 0, out[-3000:]

    a, b = load_state(os.path.join(reference, "checkpoint_last.pt")), load_state(os.path.join(save, "checkpoint_last.pt"))
    assert num_updates(a) == num_updates(b) == TOTAL
    for name in a["model"]:
        assert torch.isfinite(b["model"][name]).all(), name
        diff = (a["model"][name] - b["model"][name]).abs().max().item()
        assert torch.equal(a["model"][name], b["model"][name]), f"{name}: max |difference| {diff}"
    assert b["extra_state"]["divergence"] == {"lr_scale": 0.5, "rollbacks": 1}

    # The same run killed right after the save of the first update past the rollback, and resumed with
    # its command: the lr scale comes back from the checkpoint, so it ends as the uninterrupted run.
    killed = str(tmp_path / "killed")
    args = [*flags(data_bin, killed), "--on-divergence", "rollback", "--save-interval-updates", 1]
    runs = train(args, workers=2, env={"PROBE_POISON": POISON, "PROBE_KILL_AFTER": str(update)})
    assert [code for code, _ in runs] == [-signal.SIGKILL] * 2 and len(ROLLED_BACK.findall(runs[0][1])) == 1, \
        runs[0][1][-3000:]
    runs = train(args, workers=2, env={"PROBE_POISON": POISON})
    assert [code for code, _ in runs] == [0, 0] and f"@ {update} updates)" in runs[0][1], \
        runs[0][1][-3000:] + runs[1][1][-3000:]
    c = load_state(os.path.join(killed, "checkpoint_last.pt"))
    assert num_updates(c) == TOTAL
    for name in b["model"]:
        diff = (b["model"][name] - c["model"][name]).abs().max().item()
        assert torch.equal(b["model"][name], c["model"][name]), f"{name}: max |difference| {diff}"


def report(out):
    lines = [line for line in out.splitlines() if line.strip()]
    return lines[-1]


@pytest.mark.slow
def test_stop_is_fairseqs_behaviour_with_the_same_one_line_report(data_bin, tmp_path):
    """--on-divergence stop (the default) ends with the very report of a run without the patch."""
    env = {"PROBE_POISON": POISON}
    on = train(flags(data_bin, str(tmp_path / "run")), env=env)[0]
    off = train(flags(data_bin, str(tmp_path / "run")), env={**env, "FAIRSEQ_PLUGINS_DISABLE_PATCHES": "divergence"})[0]
    assert on[0] == off[0] != 0
    assert report(on[1]) == report(off[1]) and "Inf in the forward output of encoder.embed_tokens" in report(on[1])
    assert "rolled back" not in on[1]
