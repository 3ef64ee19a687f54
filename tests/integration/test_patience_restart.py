"""--patience survives a restart (patches/resume.py, patience_state).

The learning rate is 0.002 for epochs 1-2 and 0 from epoch 3 on (``--lr 0.002,0.002,0``, fairseq's
fixed per-epoch schedule): the validation improves at epoch 2, then every loss equals epoch 2's,
so with --patience 2 an uninterrupted run stops at the end of epoch 4. The same command killed
with SIGKILL right after epoch 1's save (best: epoch 1's loss; an improvement still to come) and
again after epoch 3's (one non-improving validation), resumed each time, must stop at the same
update (fairseq alone counted from zero again and stopped two epochs later). Once more, it ends
at once: status 0, one line naming the best loss, which must be the lowest validation loss the
uninterrupted run logged (the oracle is that run's log, not the checkpoint under test), no
update, every file under --save-dir with its sha256 and mtime. A smaller --patience ends the same
way; --patience -1 or 0 (off, as in fairseq) trains on; two workers both end with status 0 and
only rank 0 prints the line.
"""
import os
import re
import signal
import subprocess
import sys

import pytest
from helpers import ONE_THREAD, REPO, USER_DIR, cli_env, num_updates
from test_finished_run import assert_nothing_to_do, files, slurm_tasks

from fairseq_plugins.checkpoints import load_state
from fairseq_plugins.network import free_port

PROBE = os.path.join(REPO, "tests", "train_probe.py")
STOPPED = "early stop since valid performance hasn't improved for last 2 runs"


def arguments(data, save_dir, extra=()):
    """The run's fairseq-train arguments; ``extra`` flags come last and override them (argparse keeps the last)."""
    return [data, "--user-dir", USER_DIR, "--arch", "vaswani_transformer_tiny", "--optimizer", "adam",
            "--lr", "0.002,0.002,0", "--max-tokens", "2000", "--max-epoch", "8", "--patience", "2",
            "--save-dir", save_dir, "--cpu", "--seed", "1", "--no-progress-bar", "--log-interval", "1",
            "--num-workers", "0", "--no-epoch-checkpoints", *extra]


def train(data, save_dir, env=None, extra=()):
    proc = subprocess.run([sys.executable, PROBE, *arguments(data, save_dir, extra)],
                          env=cli_env({**ONE_THREAD, **(env or {})}), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600)
    return proc.returncode, proc.stdout


def last_update(save_dir):
    return num_updates(load_state(os.path.join(save_dir, "checkpoint_last.pt")))


def valid_losses(out):
    """The validation losses fairseq logged, in order, as it printed them."""
    return re.findall(r"valid on 'valid' subset \| loss ([\d.]+) \|", out)


def killed_after_epoch(data, save_dir, epoch):
    code, out = train(data, save_dir, {"PROBE_KILL_AFTER_EPOCH": str(epoch)})
    assert code == -signal.SIGKILL, out[-3000:]
    return out


@pytest.mark.slow
def test_a_run_killed_inside_patience_stops_where_the_uninterrupted_run_stops_and_then_stays_stopped(data_bin,
                                                                                                       tmp_path):
    straight, killed = str(tmp_path / "straight"), str(tmp_path / "killed")
    code, out = train(data_bin, straight)
    assert code == 0 and STOPPED in out, out[-3000:]
    losses = valid_losses(out)
    assert len(losses) == 4 and float(losses[1]) < float(losses[0]) and losses[1] == losses[2] == losses[3], losses
    stop = last_update(straight)
    per_epoch = stop // 4
    assert stop == 4 * per_epoch and "end of epoch 4 (average epoch stats below)" in out, out[-3000:]

    killed_after_epoch(data_bin, killed, 1)
    assert last_update(killed) == per_epoch
    out = killed_after_epoch(data_bin, killed, 3)
    assert f"@ {per_epoch} updates)" in out and last_update(killed) == 3 * per_epoch, out[-3000:]
    assert valid_losses(out) == losses[1:3]  # the improvement at epoch 2 happened after the restart
    code, out = train(data_bin, killed)
    assert code == 0 and f"@ {3 * per_epoch} updates)" in out and STOPPED in out, out[-3000:]
    assert last_update(killed) == stop

    before = files(killed)
    assert_nothing_to_do(train(data_bin, killed), before, files(killed),
                         f"already stopped early at update {stop}: 2 validations without improving on loss "
                         f"{float(min(losses, key=float)):g} (--patience 2); nothing to do")
    # a smaller --patience is stopped too; without --patience (-1, fairseq's default) the run trains on
    assert_nothing_to_do(train(data_bin, killed, extra=["--patience", "1"]), before, files(killed),
                         f"already stopped early at update {stop}: 2 validations without improving on loss "
                         f"{float(min(losses, key=float)):g} (--patience 1); nothing to do")
    code, out = train(data_bin, killed, extra=["--patience", "-1", "--max-epoch", "5"])
    assert code == 0 and last_update(killed) == stop + per_epoch, out[-3000:]
    code, out = train(data_bin, killed, extra=["--patience", "0", "--max-epoch", "6"])  # 0 is off too (fairseq)
    assert code == 0 and last_update(killed) == stop + 2 * per_epoch, out[-3000:]

    # two workers (SLURM tasks): both end at once with status 0, and only rank 0 prints the line
    before = files(killed)
    rank0, rank1 = slurm_tasks(arguments(data_bin, killed), free_port())
    assert_nothing_to_do(rank0, before, files(killed),
                         f"already stopped early at update {stop + 2 * per_epoch}: 2 validations without improving "
                         f"on loss {float(min(losses, key=float)):g} (--patience 2); nothing to do")
    assert rank1[0] == 0 and "nothing to do" not in rank1[1] and "num_updates=" not in rank1[1], rank1[1][-3000:]


@pytest.mark.slow
def test_without_patience_checkpoints_hold_no_early_stopping_state(data_bin, tmp_path):
    """Without --patience (fairseq's default, -1) fairseq keeps no early-stopping state: the run
    trains and saves as fairseq's does, with no "patience" entry in its checkpoint."""
    save_dir = str(tmp_path / "off")
    code, out = train(data_bin, save_dir, extra=["--patience", "-1", "--max-epoch", "1"])
    assert code == 0 and "end of epoch 1 (average epoch stats below)" in out, out[-3000:]
    assert "patience" not in load_state(os.path.join(save_dir, "checkpoint_last.pt"))["extra_state"]
