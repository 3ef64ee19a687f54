"""patches/preemption.py: a scheduler's signal and the end of a run, with the behaviours out and in."""
import contextlib
import importlib
import os
import signal
import subprocess
import sys
import types

import pytest
import hydra
from fairseq import checkpoint_utils
from fairseq.data import iterators
from helpers import REPO, cli_env
from omegaconf import open_dict
from patching import out, slurm_cfg

from fairseq_plugins.errors import ConfigError


def test_clean_exit():
    def blocked_consumer():
        iterator = iterators.BufferedIterator(1, range(100))
        next(iterator)  # starts the thread; it fills the queue and blocks on put
        return iterator._consumer
    with out("clean_exit"):
        consumer = blocked_consumer()
        assert not hasattr(consumer, "stop")  # fairseq's thread can only be abandoned
    consumer = blocked_consumer()
    importlib.import_module("fairseq_plugins.patches.preemption").stop_consumers()
    assert not consumer.is_alive()


def test_the_first_preemption_signal_is_the_one_named_and_arms_one_deadline(monkeypatch):
    """The watcher fed through its pipe as the C handler feeds it (no real signal: pytest keeps its
    own): SIGINT, then SIGTERM, SIGUSR1 and SIGTERM again. SIGINT is not a preemption; the stop names
    SIGTERM, and one --preemption-timeout deadline is armed, a daemon (it must not hold the exit of
    a run that ends normally after the signal)."""
    from fairseq_plugins.patches import preemption
    deadlines = []

    class Deadline:
        def __init__(self, seconds, then):
            self.seconds, self.daemon = seconds, False

        def start(self):
            deadlines.append((self.seconds, self.daemon))

    monkeypatch.setattr(preemption.threading, "Timer", Deadline)
    run = preemption.Preemption(30.0)
    read_fd, write_fd = os.pipe()
    os.write(write_fd, bytes([signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGTERM]))
    os.close(write_fd)
    with contextlib.suppress(IndexError):  # the pipe's end: an empty read (a real one never ends)
        run._watch(read_fd)
    os.close(read_fd)
    assert run.received == "SIGTERM" and deadlines == [(30.0, True)]


class _Exited(Exception):
    """os._exit, made to return to the test."""


def test_a_stop_saves_once_and_once_saved_its_deadline_says_no_lie(monkeypatch, tmp_path, capsys):
    """A stop agreed after an update fairseq has just saved (--save-interval-updates) writes no second
    checkpoint, one after an update it has not saved writes one; and once the stop's checkpoint is
    written, a --preemption-timeout deadline that fires (rank 0 waiting at the barrier for a slow peer)
    exits without its "stopped without a new checkpoint" line. fairseq's save and the exit are faked."""
    from fairseq_plugins.patches import preemption
    saves = []
    monkeypatch.setattr(preemption, "SAVE",
                        lambda cfg, trainer, epoch_itr, val_loss: saves.append(trainer.get_num_updates()))
    monkeypatch.setattr(preemption.os, "_exit", lambda code: (_ for _ in ()).throw(_Exited(code)))
    monkeypatch.setattr(preemption.logging, "shutdown", lambda: None)  # pytest's own handlers stay open
    trainer = types.SimpleNamespace(get_num_updates=lambda: 6, data_parallel_world_size=1, data_parallel_rank=0,
                                    checkpoint_suffix="")
    cfg = types.SimpleNamespace(checkpoint=types.SimpleNamespace(save_dir=str(tmp_path)))
    for scheduled_save in (True, False):
        trainer.preemption = preemption.Preemption(60.0)
        trainer.preemption.received = "SIGTERM"
        saves.clear()
        if scheduled_save:
            checkpoint_utils.save_checkpoint(cfg, trainer, None, None)  # fairseq's save of update 6
        with pytest.raises(_Exited, match=str(preemption.EXIT_PREEMPTED)):
            preemption._stop(cfg, trainer, None, trainer.preemption)
        assert saves == [6], scheduled_save
        assert capsys.readouterr().err.splitlines() == [
            f"preempted (SIGTERM): saved {tmp_path}/checkpoint_last.pt at update 6; rerun the same command to "
            f"resume (exit status {preemption.EXIT_PREEMPTED})"]
    with pytest.raises(_Exited):
        trainer.preemption._give_up()
    assert capsys.readouterr().err == ""


def test_preemption_option_from_the_configuration(data_bin):
    with out("preemption"):
        with pytest.raises(SystemExit):  # fairseq has no such flag
            slurm_cfg(data_bin, "--preemption-timeout", "30")
    assert slurm_cfg(data_bin, "--preemption-timeout", "30").checkpoint.preemption_timeout == 30
    assert slurm_cfg(data_bin).checkpoint.preemption_timeout == 60


@pytest.mark.parametrize("timeout", [-5.0, 0.0, 0.5])
def test_preemption_timeout_reaches_the_patch_through_train_main(data_bin, tmp_path, timeout):
    """``fairseq_cli.train.main(cfg)`` from Python: the value in the cfg is the one the patch checks;
    any positive number of seconds is taken, below one too."""
    import fairseq_cli.train
    cfg = slurm_cfg(data_bin, "--max-update", "1", "--save-dir", str(tmp_path), "--max-tokens", "500",
                    "--num-workers", "0")
    with open_dict(cfg):
        cfg.checkpoint.preemption_timeout = timeout
    if timeout > 0:
        handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGUSR1)}
        try:
            fairseq_cli.train.main(cfg)
        finally:  # the run armed its signals in this process: give pytest's back
            signal.set_wakeup_fd(-1)
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
        assert (tmp_path / "checkpoint_last.pt").is_file()
        return
    with pytest.raises(ConfigError, match=rf"^--preemption-timeout {timeout:g}: must be a positive number of seconds$"):
        fairseq_cli.train.main(cfg)


def test_preemption_timeout_reaches_the_patch_through_hydra_train(data_bin, tmp_path):
    """A config file as fairseq's docs write them, and the option added on the command line with ``+``."""
    (tmp_path / "run.yaml").write_text(f"""
task: {{_name: translation, data: {data_bin}}}
model: {{_name: transformer, encoder_layers: 1, decoder_layers: 1, encoder_embed_dim: 32, decoder_embed_dim: 32,
        encoder_ffn_embed_dim: 64, decoder_ffn_embed_dim: 64}}
criterion: {{_name: cross_entropy}}
optimizer: {{_name: adam}}
lr_scheduler: {{_name: fixed}}
optimization: {{lr: [0.001], max_update: 1}}
dataset: {{max_tokens: 500, num_workers: 0}}
common: {{cpu: true, user_dir: {REPO}/fairseq_plugins}}
checkpoint: {{save_dir: {tmp_path}}}
""")
    out_ = subprocess.run([os.path.join(os.path.dirname(sys.executable), "fairseq-hydra-train"),
                           "--config-dir", str(tmp_path), "--config-name", "run", "+checkpoint.preemption_timeout=-5",
                           f"hydra.run.dir={tmp_path}/hydra"],
                          capture_output=True, text=True, env=cli_env(), cwd=tmp_path)
    if hydra.__version__.startswith("1.0."):  # fairseq 0.12.2's hydra adds no key to a schema (docs/INSTALL.md)
        assert "Key 'preemption_timeout' not in 'CheckpointConfig'" in out_.stderr, out_.stderr[-3000:]
    else:
        assert "--preemption-timeout -5: must be a positive number of seconds" in out_.stderr, out_.stderr[-3000:]
