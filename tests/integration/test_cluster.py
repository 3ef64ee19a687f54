"""Multi-worker training as users launch it on a cluster, with CPU gloo workers on 127.0.0.1
standing in for GPUs: torchrun, SLURM tasks, fairseq's spawn; preemption; a dead worker.

The oracle of every run is one process with ``--update-freq 2`` (:func:`reference`), which
2 workers must reproduce bit for bit (tolerance 0; why it is exact: tests/integration/test_distributed.py).
Every worker runs with 1 thread, ``--dropout 0`` and one seed. A stopped run is restarted with
the command that started it, and must end bit-equal too: weights, Adam's state, update count.
"""
import logging
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
from helpers import BIN, ONE_THREAD, USER_DIR, cli_env, num_updates, run, slurm_env

from fairseq_plugins.checkpoints import load_state
from fairseq_plugins.errors import ConfigError
from fairseq_plugins.network import free_port
from fairseq_plugins.patches import launch
from fairseq_plugins.patches.launch import first_host

TOTAL = 16  # updates: 4 epochs of 4 updates (2 batches of --max-tokens 600 each)
EXIT_PREEMPTED = 75
BOUND = 60  # seconds a stop may take (the default --preemption-timeout)
# seconds from kill -9 of one worker to the other's exit: measured 5.9-6.5 s (3 runs, AMD EPYC, 2 cores at
# load average 17, 2026-12-01), mostly the interpreter's teardown; 20 s leaves a 3x margin (docs/SCALE.md cites it)
LOST_WORKER_BOUND = 20


def flags(data, save_dir, *extra, updates=TOTAL):
    return [data, "--user-dir", USER_DIR, "--arch", "vaswani_transformer_tiny", "--dropout", "0",
            "--criterion", "label_smoothed_xent", "--optimizer", "adam", "--lr", "0.002", "--max-tokens", "600",
            "--max-update", str(updates), "--seed", "1", "--save-dir", save_dir, "--disable-validation",
            "--no-progress-bar", "--log-interval", "1", "--num-workers", "0", "--cpu", *map(str, extra)]


def torchrun(port):
    return [os.path.join(BIN, "torchrun"), "--nproc-per-node", "2", "--master-port", str(port),
            os.path.join(BIN, "fairseq-train")]


def start(cmd, env, log):
    with open(log, "w") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen([str(c) for c in cmd], env=cli_env(env), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def start_slurm(data, save_dir, port, tmp_path, *extra, updates=TOTAL):
    """Two SLURM tasks as srun starts them: the same command, SLURM_PROCID 0 and 1."""
    return [start(["fairseq-train", *flags(data, save_dir, "--distributed-port", port, *extra, updates=updates)],
                  {**ONE_THREAD, **slurm_env(rank, 2)}, tmp_path / f"rank{rank}.log") for rank in (0, 1)]


def wait_all(procs, timeout=300):
    return [p.wait(timeout=timeout) for p in procs]


def updates_logged(log):
    found = re.findall(r"num_updates=(\d+)", open(log).read())
    return int(found[-1]) if found else 0


def wait_for_update(log, update, procs, timeout=240):
    """Poll the log until it reports ``update``; return the last update seen."""
    end = time.time() + timeout
    while time.time() < end:
        seen = updates_logged(log)
        if seen >= update:
            return seen
        assert all(p.poll() is None for p in procs), open(log).read()[-3000:]
        time.sleep(0.02)
    raise AssertionError(f"update {update} never logged in {timeout} s")


def assert_equal_runs(path, reference_path):
    a, b = load_state(reference_path), load_state(path)
    assert num_updates(a) == num_updates(b) == TOTAL
    assert a["model"].keys() == b["model"].keys()
    for name in a["model"]:
        diff = (a["model"][name] - b["model"][name]).abs().max().item()
        assert torch.equal(a["model"][name], b["model"][name]), f"{name}: max |difference| {diff}"
    for i, moments in a["last_optimizer_state"]["state"].items():
        for key, value in moments.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(b["last_optimizer_state"]["state"][i][key]))
    assert a["extra_state"]["train_iterator"] == b["extra_state"]["train_iterator"]


@pytest.fixture(scope="module")
def reference(data_bin, tmp_path_factory):
    """checkpoint_last.pt of 1 process × --update-freq 2, TOTAL updates."""
    save = str(tmp_path_factory.mktemp("reference"))
    run(["fairseq-train", *flags(data_bin, save, "--update-freq", 2)], env=ONE_THREAD)
    return os.path.join(save, "checkpoint_last.pt")


# ------------------------------------------------------------------ launchers
# No launcher runs alone from scratch: torchrun's, SLURM's and spawn's runs are the ones stopped and
# resumed below, and each of those ends bit-equal to the reference.

def last_line(text):
    return [line for line in text.splitlines() if line.strip()][-1]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["slurm without a port", "torchrun with another world size", "fp16", "memory-efficient-fp16"])
def test_impossible_launches_stop_at_once_with_one_line(data_bin, tmp_path, case):
    save = str(tmp_path / "save")
    if case == "slurm without a port":
        cmd, env = ["fairseq-train", *flags(data_bin, save)], {**ONE_THREAD, **slurm_env(0, 2)}
        expected = "error: SLURM job of 2 tasks: pass --distributed-port PORT (a free port on localhost, "
    elif case == "torchrun with another world size":
        cmd, env = [*torchrun(free_port()), *flags(data_bin, save, "--distributed-world-size", 3)], ONE_THREAD
        expected = "error: --distributed-world-size 3: torchrun started 2 workers; drop the flag"
    else:
        cmd, env = ["fairseq-train", *flags(data_bin, save, f"--{case}")], ONE_THREAD
        expected = f"error: --{case}: fairseq's fp16 training needs a CUDA GPU; on CPU train in fp32"
    proc = run(cmd, env=env, check=False)
    assert proc.returncode != 0
    lines = [line.split("]: ", 1)[-1] for line in proc.stdout.splitlines()]  # torchrun prefixes "[rankN]: "
    assert any(line.startswith(expected) for line in lines), proc.stdout[-3000:]
    if "torchrun" not in case:
        assert "Traceback" not in proc.stdout and last_line(proc.stdout).startswith(expected)
    assert not os.path.exists(os.path.join(save, "checkpoint_last.pt"))


# ------------------------------------------------------------------ preemption

def preempt_and_restart(launch, signal_to, signums, log, named=None):
    """Start ``launch()``; for each of ``signums`` in turn: send it to ``signal_to(procs)`` once 2 more
    updates are logged, check the stop (its line in ``log`` names the signal, or one of ``named``), start
    the same command again. The last start must run to the end. Returns the exit codes of every stop."""
    procs, after, resumed_from, codes = launch(), 2, None, []
    for signum in signums:
        seen = wait_for_update(log, after, procs)
        if resumed_from is not None:
            assert f"@ {resumed_from} updates)" in open(log).read()  # fairseq's "Loaded checkpoint" line
        sent = time.time()
        os.kill(signal_to(procs), signum)
        codes.append(wait_all(procs, timeout=BOUND + 30))
        assert time.time() - sent < BOUND
        text = open(log).read()
        stop = re.search(r"preempted \((\w+|signal to another worker)\): saved (\S+) at update (\d+); rerun the same "
                         rf"command to resume \(exit status {EXIT_PREEMPTED}\)", text)
        assert stop, text[-3000:]
        assert stop.group(1) in (named or {signal.Signals(signum).name}), stop.group(0)
        resumed_from = int(stop.group(3))
        assert seen <= resumed_from < TOTAL
        assert num_updates(load_state(stop.group(2))) == resumed_from
        procs, after = launch(), resumed_from + 2
    assert wait_all(procs) == [0] * len(procs), open(log).read()[-3000:]
    assert f"@ {resumed_from} updates)" in open(log).read()
    return codes


@pytest.mark.slow
def test_one_process_preempted_by_sigterm_then_sigusr1_saves_and_resumes_bit_equal(data_bin, reference, tmp_path):
    """Both signals in one run: SIGTERM after update 2, SIGUSR1 2 updates into the restart."""
    save, log = str(tmp_path / "save"), tmp_path / "train.log"

    def launch():
        return [start(["fairseq-train", *flags(data_bin, save, "--update-freq", 2)], ONE_THREAD, log)]

    codes = preempt_and_restart(launch, lambda procs: procs[0].pid, [signal.SIGTERM, signal.SIGUSR1], log)
    assert codes == [[EXIT_PREEMPTED], [EXIT_PREEMPTED]]
    assert_equal_runs(os.path.join(save, "checkpoint_last.pt"), reference)


# fairseq-train in which rank 0, once a stop is agreed, waits STOP_DELAY seconds before its save (a slow
# disk, a loaded machine: what the other ranks must not outrun), every worker prints, as it exits,
# the update that checkpoint_last.pt holds at that moment, and a worker whose interpreter tears
# down writes its rank to $TEARDOWN_LOG.
STOP_DELAY = 5
DELAYED_AT_THE_STOP = f"""
import atexit, os, sys, time
import fairseq_plugins  # the suite's patches, as --user-dir installs them
from fairseq_plugins.checkpoints import load_state
from fairseq_plugins.patches import preemption
from fairseq_cli.train import cli_main
rank, save_dir = int(os.environ["SLURM_PROCID"]), sys.argv[sys.argv.index("--save-dir") + 1]
agreed = preemption._stop_agreed
def delayed(trainer, preemption_state):
    stop = agreed(trainer, preemption_state)
    if stop and rank == 0:
        time.sleep({STOP_DELAY})
    return stop
preemption._stop_agreed = delayed
def report():
    path = os.path.join(save_dir, "checkpoint_last.pt")
    held = load_state(path)["optimizer_history"][-1]["num_updates"] if os.path.exists(path) else None
    print(f"rank {{rank}} exits; checkpoint_last.pt holds update {{held}}", flush=True)
atexit.register(report)  # an exit through the interpreter's end
def torn_down():  # runs only in an exit through the interpreter's teardown
    with open(os.environ["TEARDOWN_LOG"], "a") as f:
        f.write(f"rank {{rank}}\\n")
atexit.register(torn_down)
exit_now = os._exit
def reported_exit(code):
    report()
    exit_now(code)
os._exit = reported_exit
sys.argv[0] = "fairseq-train"
cli_main()
"""


@pytest.mark.slow
def test_signal_to_one_of_two_slurm_tasks_stops_both_at_one_update(data_bin, reference, tmp_path):
    """SIGUSR1 reaches rank 1 only: rank 0 must stop at the same update (else a collective hangs),
    rank 1 must not exit before rank 0's checkpoint of the stop is complete, even when rank 0 is slow
    to write it (delayed at the stop: deterministic), and neither stopped worker runs the
    interpreter's teardown (which races with the peers' exits): only the restart's two workers,
    which end normally, run its atexit hooks."""
    save, port, launches, teardown = str(tmp_path / "save"), free_port(), [], tmp_path / "teardown"

    def launch():
        launches.append(tmp_path / f"rank1.run{len(launches)}.log")
        return [start([sys.executable, "-c", DELAYED_AT_THE_STOP,
                       *flags(data_bin, save, "--distributed-port", port)],
                      {**ONE_THREAD, **slurm_env(rank, 2), "TEARDOWN_LOG": str(teardown)},
                      tmp_path / "rank0.log" if rank == 0 else launches[-1]) for rank in (0, 1)]

    codes = preempt_and_restart(launch, lambda procs: procs[1].pid, [signal.SIGUSR1], tmp_path / "rank0.log",
                                named={"signal to another worker"})
    assert codes == [[EXIT_PREEMPTED, EXIT_PREEMPTED]]
    stopped_at = int(re.search(r"@ (\d+) updates\)", open(tmp_path / "rank0.log").read()).group(1))  # the restart's
    rank1 = open(launches[0]).read()
    assert "distributed init (rank 1): tcp://localhost:" in rank1
    assert f"rank 1 exits; checkpoint_last.pt holds update {stopped_at}" in rank1, rank1[-3000:]
    assert "preempted (" not in rank1  # rank 0 alone says so
    assert sorted(teardown.read_text().splitlines()) == ["rank 0", "rank 1"]
    assert_equal_runs(os.path.join(save, "checkpoint_last.pt"), reference)


@pytest.mark.slow
def test_sigterm_to_torchrun_stops_its_workers_and_resumes_bit_equal(data_bin, reference, tmp_path):
    save, log, port = str(tmp_path / "save"), tmp_path / "train.log", free_port()

    def launch():
        return [start([*torchrun(port), *flags(data_bin, save)], ONE_THREAD, log)]

    # torchrun passes the signal on to both workers: rank 0 may see the stop agreed before its own arrives
    [codes] = preempt_and_restart(launch, lambda procs: procs[0].pid, [signal.SIGTERM], log,
                                  named={"SIGTERM", "signal to another worker"})
    assert codes[0] != 0  # torchrun's own status (its workers exit with 75)
    text = open(log).read()  # the restart's
    assert "distributed init (rank 0): env://" in text and "distributed init (rank 1): env://" in text
    assert_equal_runs(os.path.join(save, "checkpoint_last.pt"), reference)


@pytest.mark.slow
def test_preemption_timeout_bounds_a_stop_that_cannot_happen(data_bin, tmp_path):
    """Rank 1 is frozen (SIGSTOP), so rank 0 can never agree on a stop with it: after
    --preemption-timeout it must exit anyway, leaving the last checkpoint as it was."""
    save = str(tmp_path / "save")
    procs = start_slurm(data_bin, save, free_port(), tmp_path, "--preemption-timeout", 5, "--save-interval-updates", 1)
    wait_for_update(tmp_path / "rank0.log", 2, procs)
    os.kill(procs[1].pid, signal.SIGSTOP)
    time.sleep(1)  # rank 0 is now waiting for rank 1 in the next update's all-reduce
    os.kill(procs[0].pid, signal.SIGTERM)
    sent = time.time()
    try:
        assert procs[0].wait(timeout=BOUND) == EXIT_PREEMPTED
        assert time.time() - sent < 5 + 10
    finally:
        procs[1].kill()
        wait_all(procs)
    assert last_line(open(tmp_path / "rank0.log").read()) == (
        "error: SIGTERM: no update boundary reached within --preemption-timeout 5 s; stopped without a new "
        "checkpoint (a restart resumes from checkpoint_last.pt)")
    load_state(os.path.join(save, "checkpoint_last.pt"))  # still a whole checkpoint


# ------------------------------------------------------------------ what only a real cluster sets

@pytest.mark.parametrize("nodelist, host", [
    ("gpu[03-05,9],cpu1", "gpu03"), ("node-[1-2]", "node-1"), ("cpu1,gpu[03-05]", "cpu1"), ("n[9]", "n9"),
    ("localhost", "localhost"), ("rack2-node[017-020]-ib", "rack2-node017-ib")])
def test_first_host_of_slurm_node_lists(nodelist, host):
    """SLURM's compressed host lists (what ``scontrol show hostnames`` would list first)."""
    assert first_host(nodelist) == host


def launch_in_process(monkeypatch, argv, env):
    """fairseq-train's launch (fairseq's distributed_utils.call_main, as fairseq_cli.train calls it) on the
    parsed command line ``argv``, under the launcher's environment ``env``; training must not start."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.distributed import utils as distributed_utils

    for key in [k for k in os.environ if k.startswith("SLURM_") or k in ("WORLD_SIZE", "RANK", "MASTER_ADDR")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))
    distributed_utils.call_main(cfg, lambda *args, **kwargs: pytest.fail("training started"))


SLURM_TASK = {"SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NNODES": "2",
              "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "job[04-05]"}


@pytest.mark.parametrize("extra_env, host", [({}, "job04"), ({"SLURM_STEP_NODELIST": "step[7-8]"}, "step7")])
def test_slurm_rendezvous_host_is_the_first_of_the_step_node_list(data_bin, tmp_path, monkeypatch, extra_env, host):
    """The port refusal names the host every task would meet on: the first of SLURM_STEP_NODELIST
    (the nodes of this srun step) where set, else of SLURM_JOB_NODELIST."""
    with pytest.raises(ConfigError) as refused:
        launch_in_process(monkeypatch, flags(data_bin, str(tmp_path)), {**SLURM_TASK, **extra_env})
    assert str(refused.value) == (f"SLURM job of 2 tasks: pass --distributed-port PORT (a free port on {host}, "
                                  "the same for every task)")


def test_a_rank_for_a_spawning_launch_is_refused_in_one_line(data_bin, tmp_path, monkeypatch):
    """--distributed-rank with fairseq's spawn (no --distributed-no-spawn) stops before any process starts."""
    extra = ["--distributed-world-size", "2", "--distributed-init-method", "tcp://127.0.0.1:1", "--distributed-rank", "1"]
    with pytest.raises(ConfigError) as refused:
        launch_in_process(monkeypatch, flags(data_bin, str(tmp_path), *extra), {})
    assert str(refused.value) == ("--distributed-rank 1 without --distributed-no-spawn: on CPU start one process per "
                                  "worker (torchrun, srun) or add --distributed-no-spawn")


@pytest.mark.parametrize("extra, logged", [
    (["--distributed-backend", "nccl"], "--cpu: --distributed-backend gloo (nccl needs GPUs)"),
    (["--ddp-backend", "pytorch_ddp"], "--cpu: --ddp-backend legacy_ddp (pytorch_ddp gives each worker a GPU)"),
    (["--ddp-backend", "c10d"], "--cpu: --ddp-backend legacy_ddp (c10d gives each worker a GPU)"),
])
def test_gpu_only_backends_become_the_cpu_ones_with_one_line(data_bin, tmp_path, caplog, extra, logged):
    """nccl and pytorch_ddp/c10d (fairseq's defaults, and the only ones a typed value can't be told from
    in the parsed configuration) need a GPU per worker: with --cpu the workers use gloo and legacy_ddp."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    argv = flags(data_bin, str(tmp_path), "--distributed-world-size", "2", *extra)
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))
    with caplog.at_level(logging.INFO, logger=launch.__name__):
        launch.configure_cpu(cfg)
    d = cfg.distributed_training
    assert (d.distributed_backend, d.ddp_backend) == ("gloo", "legacy_ddp")
    assert logged in caplog.messages


# ------------------------------------------------------------------ a dead worker

@pytest.mark.slow
def test_kill_9_of_one_worker_ends_the_other_with_one_line_and_both_resume(data_bin, reference, tmp_path):
    save, port = str(tmp_path / "save"), free_port()
    procs = start_slurm(data_bin, save, port, tmp_path, "--save-interval-updates", 4)
    wait_for_update(tmp_path / "rank0.log", 5, procs)
    os.kill(procs[1].pid, signal.SIGKILL)
    killed = time.time()
    code = procs[0].wait(timeout=BOUND + 30)
    assert time.time() - killed < LOST_WORKER_BOUND
    wait_all(procs)
    text = open(tmp_path / "rank0.log").read()
    assert code == 1 and "Traceback" not in text, text[-3000:]
    assert re.search(r"error: lost rank 1 of 2 during training \(gloo: [^)]*\); stopped; restart all workers with "
                     r"the same command to resume from \S+checkpoint_last\.pt$", last_line(text)), text[-3000:]
    resumed_from = num_updates(load_state(os.path.join(save, "checkpoint_last.pt")))
    assert 4 <= resumed_from < TOTAL

    assert wait_all(start_slurm(data_bin, save, port, tmp_path, "--save-interval-updates", 4)) == [0, 0]
    assert f"@ {resumed_from} updates)" in open(tmp_path / "rank0.log").read()
    assert_equal_runs(os.path.join(save, "checkpoint_last.pt"), reference)


# ------------------------------------------------------------------ resume across epochs and world sizes

@pytest.mark.slow
def test_resume_in_later_epochs_and_across_world_sizes_is_bit_equal(data_bin, reference, tmp_path):
    """One run in four parts, each resuming the previous part's checkpoint_last.pt: 1 process to the
    end of epoch 1 (update 4), 2 workers spawned by fairseq to the end of epoch 2 (8), 1 process to
    the middle of epoch 3 (10), 1 process to the end. fairseq alone grouped a resumed epoch's
    batches from another seed (7e-3 after 4 updates)."""
    save = str(tmp_path / "save")
    parts = [("1 process", 4), ("2 workers", 8), ("1 process", 10), ("1 process", TOTAL)]
    for i, (layout, updates) in enumerate(parts):
        extra = ["--update-freq", 2] if layout == "1 process" else ["--distributed-world-size", 2]
        log = run(["fairseq-train", *flags(data_bin, save, *extra, updates=updates)], env=ONE_THREAD)
        if i:
            stop = parts[i - 1][1]
            assert f"(epoch {stop // 4 + 1} @ {stop} updates)" in log, (layout, stop)
        if layout == "2 workers":
            assert "distributed init (rank 0): tcp://127.0.0.1:" in log
    assert_equal_runs(os.path.join(save, "checkpoint_last.pt"), reference)
