"""--patience survives a restart (patches/patience_state.py).

With --lr 0 the weights never change, so every validation loss equals the first: with
--patience 2 an uninterrupted run stops at the end of epoch 3 (best at epoch 1, no improvement
at epochs 2 and 3). A run killed with SIGKILL right after epoch 2's save (one non-improving
validation) and resumed must stop at the same update (fairseq alone counted from zero again and
stopped at epoch 5). The same command once more ends at once: status 0, one line, no update,
every file under --save-dir with its sha256 and mtime.
"""
import os
import signal
import subprocess
import sys

import pytest
from helpers import ONE_THREAD, USER_DIR, cli_env, num_updates
from test_finished_run import assert_nothing_to_do, files

from fairseq_plugins.checkpoints import load_state

PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_probe.py")


def train(data, save_dir, env=None):
    cmd = [sys.executable, PROBE, data, "--user-dir", USER_DIR, "--arch", "vaswani_transformer_tiny",
           "--optimizer", "adam", "--lr", "0", "--max-tokens", "2000", "--max-epoch", "8", "--patience", "2",
           "--save-dir", save_dir, "--cpu", "--seed", "1", "--no-progress-bar", "--log-interval", "1",
           "--num-workers", "0", "--no-epoch-checkpoints"]
    proc = subprocess.run(cmd, env=cli_env({**ONE_THREAD, **(env or {})}), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600)
    return proc.returncode, proc.stdout


def last_update(save_dir):
    return num_updates(load_state(os.path.join(save_dir, "checkpoint_last.pt")))


@pytest.mark.slow
def test_a_run_killed_inside_patience_stops_where_the_uninterrupted_run_stops_and_then_stays_stopped(data_bin,
                                                                                                       tmp_path):
    straight, killed = str(tmp_path / "straight"), str(tmp_path / "killed")
    code, out = train(data_bin, straight)
    assert code == 0 and "early stop since valid performance hasn't improved for last 2 runs" in out, out[-3000:]
    stop = last_update(straight)
    per_epoch = stop // 3
    assert stop == 3 * per_epoch and f"end of epoch 3 (average epoch stats below)" in out, out[-3000:]

    code, out = train(data_bin, killed, {"PROBE_KILL_AFTER_EPOCH": "2"})
    assert code == -signal.SIGKILL and last_update(killed) == 2 * per_epoch, out[-3000:]
    code, out = train(data_bin, killed)
    assert code == 0 and f"@ {2 * per_epoch} updates)" in out, out[-3000:]
    assert "early stop since valid performance hasn't improved for last 2 runs" in out, out[-3000:]
    assert last_update(killed) == stop

    before = files(killed)
    rerun = train(data_bin, killed)
    loss = load_state(os.path.join(killed, "checkpoint_last.pt"))["extra_state"]["patience"]["best"]
    assert_nothing_to_do(rerun, before, files(killed), f"already stopped early at update {stop}: 2 validations "
                                                       f"without improving on loss {loss:g} (--patience 2); nothing to do")
