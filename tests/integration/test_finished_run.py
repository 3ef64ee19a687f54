"""A finished fairseq-train run stays finished (patches/resume.py, finished_run).

The same command run again on a run whose checkpoint is at --max-update (or past --max-epoch)
must end at once with status 0 and one line, and write nothing: every file under --save-dir keeps
its bytes and its mtime. fairseq alone trained update N+1 and overwrote checkpoint_last.pt and
checkpoint_best.pt. A run killed with SIGKILL between its final save and its exit, then rerun,
must hold exactly what an uninterrupted run holds, with 1 and 2 workers.
"""
import hashlib
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch
from helpers import ONE_THREAD, TINY_BUILTIN_TRANSFORMER, USER_DIR, cli_env, in_parallel, num_updates, slurm_env

from fairseq_plugins.checkpoints import load_state
from fairseq_plugins.network import free_port

UPDATES = 6  # the data_bin corpus is 5 batches of --max-tokens 1000: the runs end inside epoch 2
ARCHS = {
    "vaswani_transformer_tiny": ["--arch", "vaswani_transformer_tiny"],
    "rnnsearch_tiny": ["--arch", "rnnsearch_tiny"],
    "transformer": TINY_BUILTIN_TRANSFORMER,
}
ENV = {**ONE_THREAD, "PYTHONUNBUFFERED": "1"}

# fairseq-train, killed with SIGKILL right after its final save (every worker, once all have
# reached that point): the moment between the last checkpoint write and the process's exit.
KILL_AFTER_FINAL_SAVE = """
import os, signal, sys
import fairseq_plugins  # the suite's patches, as --user-dir installs them
import torch.distributed as dist
from fairseq import checkpoint_utils
from fairseq_cli.train import cli_main
save = checkpoint_utils.save_checkpoint
def save_then_die(cfg, trainer, epoch_itr, val_loss):
    path = save(cfg, trainer, epoch_itr, val_loss)
    if trainer.get_num_updates() >= trainer.cfg.optimization.max_update:
        if dist.is_initialized():
            dist.barrier()  # rank 0 has written the checkpoint too
        os.kill(os.getpid(), signal.SIGKILL)
    return path
checkpoint_utils.save_checkpoint = save_then_die
sys.argv[0] = "fairseq-train"
cli_main()
"""

# fairseq-train that prints a line (print, not logging: fairseq lowers the log level of every rank
# but 0 to WARNING) each time a worker starts a training step.
TRAIN_STEP_MARKED = """
import sys
import fairseq_plugins  # the suite's patches, as --user-dir installs them
from fairseq.trainer import Trainer
from fairseq_cli.train import cli_main
train_step = Trainer.train_step
def marked_train_step(self, *args, **kwargs):
    print(f"train_step on rank {self.data_parallel_rank}", flush=True)
    return train_step(self, *args, **kwargs)
Trainer.train_step = marked_train_step
sys.argv[0] = "fairseq-train"
cli_main()
"""


def train_args(data, save_dir, arch, stop, *extra):
    return [str(a) for a in [data, "--user-dir", USER_DIR, *ARCHS[arch], "--optimizer", "adam", "--lr", "0.002",
                             "--max-tokens", "1000", *stop, "--save-dir", save_dir, "--cpu", "--seed", "1",
                             "--no-progress-bar", "--log-interval", "1", "--num-workers", "0", *extra]]


def start(cmd, env=None):
    return subprocess.Popen(cmd, env=cli_env({**ENV, **(env or {})}), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(procs, timeout=300):
    """[(exit status, output)] of each process."""
    return [(p.wait(timeout=timeout), p.communicate()[0]) for p in procs]


def fairseq_train(args, env=None):
    return finish([start(["fairseq-train", *args], env)])[0]


def slurm_tasks(args, port, script=None):
    """Two SLURM tasks as srun starts them (gloo on localhost): the same command, SLURM_PROCID 0 and 1."""
    cmd = [sys.executable, "-c", script] if script else ["fairseq-train"]
    return finish([start([*cmd, *args, "--distributed-port", str(port)], slurm_env(rank, 2)) for rank in (0, 1)])


def files(save_dir):
    """{path under save_dir: (sha256, mtime in ns)} of every file."""
    found = {}
    for root, _, names in os.walk(save_dir):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, save_dir)] = (hashlib.sha256(f.read()).hexdigest(),
                                                          os.stat(path).st_mtime_ns)
    return found


def assert_trained(result):
    code, output = result
    assert code == 0, output[-3000:]
    return output


def assert_nothing_to_do(result, before, after, line):
    code, output = result
    assert code == 0, output[-3000:]
    rewritten = sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
    assert not rewritten, f"written: {rewritten}\n{output[-3000:]}"
    assert "num_updates=" not in output, output[-3000:]  # not a single update
    assert output.count(line) == 1 and line in output.splitlines(), output[-3000:]


def assert_same_training(path, reference):
    """The model, the optimizer state, the update count and the iterator position, bit for bit."""
    a, b = load_state(reference), load_state(path)
    assert num_updates(a) == num_updates(b) == UPDATES
    assert a["model"].keys() == b["model"].keys()
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    for i, moments in a["last_optimizer_state"]["state"].items():
        for key, value in moments.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(b["last_optimizer_state"]["state"][i][key]))
    assert a["extra_state"]["train_iterator"] == b["extra_state"]["train_iterator"]


@pytest.fixture(scope="module")
def runs(data_bin, tmp_path_factory):
    """The runs of the tests below, two at a time: {name: (save dir, its files before and after the last
    command, the update of its checkpoint_last.pt before, the last command's (status, output))}, and
    the killed run's status and output under "killed"."""
    def again(save_dir, args):
        before = files(save_dir)
        update = num_updates(load_state(os.path.join(save_dir, "checkpoint_last.pt")))
        result = fairseq_train(args)
        return save_dir, before, files(save_dir), update, result

    def twice(arch):
        save_dir = str(tmp_path_factory.mktemp(arch))
        args = train_args(data_bin, save_dir, arch, ["--max-update", UPDATES])
        assert_trained(fairseq_train(args))
        return again(save_dir, args)

    def by_epoch_then_killed():
        """--max-epoch 1 twice; then --max-update UPDATES (a resume that must train on), killed after its
        final save; then that command again."""
        save_dir = str(tmp_path_factory.mktemp("epoch"))
        by_epoch = train_args(data_bin, save_dir, "vaswani_transformer_tiny", ["--max-epoch", 1])
        assert_trained(fairseq_train(by_epoch))
        epoch_run = again(save_dir, by_epoch)
        # --max-epoch 2 as well: a run that completed epoch 1 of 2 is not finished
        args = train_args(data_bin, save_dir, "vaswani_transformer_tiny", ["--max-update", UPDATES, "--max-epoch", 2])
        killed = finish([start([sys.executable, "-c", KILL_AFTER_FINAL_SAVE, *args])])[0]
        after_kill = again(save_dir, args)
        lower = train_args(data_bin, save_dir, "vaswani_transformer_tiny", ["--max-update", UPDATES - 3])
        return {"--max-epoch": epoch_run, "killed": killed, "after kill": after_kill,
                "--max-update below": again(save_dir, lower)}

    *by_arch, rest = in_parallel([lambda arch=arch: twice(arch) for arch in ARCHS] + [by_epoch_then_killed])
    return {**dict(zip(ARCHS, by_arch)), **rest}


@pytest.mark.slow
@pytest.mark.parametrize("case", [*ARCHS, "--max-epoch", "--max-update below"])
def test_the_same_command_again_ends_at_once_and_writes_nothing(runs, case):
    """The same command, or one whose --max-update is below the checkpoint's update, on a finished run."""
    save_dir, before, after, update, second = runs[case]
    assert {"checkpoint_last.pt", "checkpoint_best.pt", "checkpoint1.pt"} <= before.keys()
    line = f"already trained to update {update}; nothing to do"
    if case == "--max-epoch":
        assert update == 5  # the end of epoch 1
        line += " (--max-epoch 1 reached)"
    else:
        assert update == UPDATES
    assert_nothing_to_do(second, before, after, line)


@pytest.mark.slow
def test_kill_9_after_the_final_save_then_rerun_is_the_uninterrupted_run(runs):
    """One process, resumed at the end of epoch 1 and killed after its final save: the rerun
    ends at once, holding what the uninterrupted run holds."""
    code, output = runs["killed"]
    assert code == -signal.SIGKILL, output[-3000:]
    assert "(epoch 2 @ 5 updates)" in output  # fairseq's "Loaded checkpoint" line: it resumed and trained on
    save_dir, before, after, update, rerun = runs["after kill"]
    assert update == UPDATES  # the final save was complete
    assert_nothing_to_do(rerun, before, after, f"already trained to update {UPDATES}; nothing to do")
    reference_dir = runs["vaswani_transformer_tiny"][0]
    assert_same_training(os.path.join(save_dir, "checkpoint_last.pt"), os.path.join(reference_dir, "checkpoint_last.pt"))


@pytest.mark.slow
def test_two_workers_end_at_once_and_after_a_kill_9_resume_to_the_uninterrupted_run(data_bin, tmp_path):
    """Two SLURM tasks (gloo workers): an uninterrupted run, and one whose workers are both killed
    after the final save, then run again: both workers exit 0, nothing is written, and it holds
    what the uninterrupted run holds."""
    port, straight_dir, killed_dir = free_port(), str(tmp_path / "straight"), str(tmp_path / "killed")
    straight = slurm_tasks(train_args(data_bin, straight_dir, "vaswani_transformer_tiny", ["--max-update", UPDATES]),
                           port, TRAIN_STEP_MARKED)
    for rank, result in enumerate(straight):  # the marker a training step prints reaches each rank's output
        assert f"train_step on rank {rank}" in assert_trained(result), result[1][-3000:]
    args = train_args(data_bin, killed_dir, "vaswani_transformer_tiny", ["--max-update", UPDATES])
    killed = slurm_tasks(args, port, KILL_AFTER_FINAL_SAVE)
    assert [code for code, _ in killed] == [-signal.SIGKILL] * 2, killed[0][1][-3000:]
    assert "distributed init (rank 1): tcp://localhost:" in killed[1][1] + killed[0][1]
    before = files(killed_dir)
    rank0, rank1 = slurm_tasks(args, port, TRAIN_STEP_MARKED)
    assert_nothing_to_do(rank0, before, files(killed_dir), f"already trained to update {UPDATES}; nothing to do")
    assert "train_step on rank" not in rank0[1], rank0[1][-3000:]
    assert rank1[0] == 0 and "train_step on rank" not in rank1[1], rank1[1][-3000:]
    assert "nothing to do" not in rank1[1], rank1[1][-3000:]  # the line once, from rank 0
    assert_same_training(os.path.join(killed_dir, "checkpoint_last.pt"), os.path.join(straight_dir, "checkpoint_last.pt"))


@pytest.mark.slow
def test_with_the_patch_off_fairseq_trains_one_more_update(runs, data_bin, tmp_path):
    """The control (FAIRSEQ_PLUGINS_DISABLE_PATCHES=finished_run): fairseq's own loop steps before it
    checks --max-update, so the same command again saves update N+1."""
    finished_dir = runs["vaswani_transformer_tiny"][0]
    save_dir = str(tmp_path / "copy")
    shutil.copytree(finished_dir, save_dir)
    args = train_args(data_bin, save_dir, "vaswani_transformer_tiny", ["--max-update", UPDATES])
    assert_trained(fairseq_train(args, {"FAIRSEQ_PLUGINS_DISABLE_PATCHES": "finished_run"}))
    assert num_updates(load_state(os.path.join(save_dir, "checkpoint_last.pt"))) == UPDATES + 1


def test_a_program_with_its_own_trainer_object_gets_fairseqs_resume_unchanged():
    """The patch acts on fairseq's Trainer only: another program's trainer-like object whose
    checkpoint is at --max-update gets fairseq's (extra_state, epoch_itr) back, and no exit."""
    from types import SimpleNamespace

    from fairseq_plugins.patches import resume

    extra_state, epoch_itr = {"train_iterator": {"epoch": 3}}, SimpleNamespace(next_epoch_idx=3)
    cfg = SimpleNamespace(optimization=SimpleNamespace(max_update=5, max_epoch=2))
    stand_in = SimpleNamespace(cfg=cfg, get_num_updates=lambda: 5, data_parallel_rank=0)
    fairseqs = lambda cfg, trainer, **kwargs: (extra_state, epoch_itr)  # noqa: E731
    assert resume.end_a_finished_run(fairseqs, cfg, stand_in) == (extra_state, epoch_itr)
