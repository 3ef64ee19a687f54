"""Starting and stopping the workers of ``fairseq-train``.

Behaviours (``FAIRSEQ_PLUGINS_DISABLE_PATCHES`` takes each name, or ``launch`` for all):

* ``lost_worker``: a worker that dies never leaves the others waiting: they stop with one line naming it.

  With gloo, a worker killed during training makes its peers' next collective fail
  ("Connection closed by peer", a traceback from inside torch), and a worker that hangs without
  dying (stopped, or its machine unreachable) makes them wait for the process group's timeout,
  30 minutes by default. Here:

  * at start-up the workers exchange their process ids and host ids (one all-gather of integers);
  * a collective that fails becomes :class:`LostWorker`, one line naming the lost rank (a rank on
    this host whose process is gone; with two workers, the other one) and where a restart resumes;
  * fairseq's ``--heartbeat-timeout S`` (otherwise only a watchdog on the forward pass) also
    becomes the process group's timeout, so a silent peer ends the run after S seconds.

* ``cpu_launch``: multi-worker ``fairseq-train --cpu`` started the way users start it: torchrun, SLURM, spawn.

  fairseq infers the workers from CUDA devices (``fairseq.distributed.utils.call_main`` and
  ``infer_init_method``), so on CPU (tested with fairseq-fixed 0.12.3.1):

  * ``torchrun --nproc-per-node 2 fairseq-train ... --cpu`` trains two unrelated models and exits 0
    (the world size defaults to the GPU count, 1), and with ``--distributed-world-size 2`` it dies
    in ``rank % torch.cuda.device_count()``;
  * SLURM tasks are counted per GPU (``scontrol`` and ``torch.cuda.device_count()``);
  * ``--distributed-world-size 2 --cpu`` stops with "world size is 2 but have 0 available devices",
    and with an explicit ``--distributed-init-method`` it spawns 0 processes and exits 0;
  * the defaults ``--distributed-backend nccl`` and ``--ddp-backend pytorch_ddp`` need GPUs.

  With ``--cpu`` this patch reads the launcher's environment instead: torchrun's ``WORLD_SIZE``/
  ``RANK``/``LOCAL_RANK`` (``env://``), SLURM's ``SLURM_NTASKS``/``SLURM_PROCID``/``SLURM_LOCALID``
  and the first host of ``SLURM_STEP_NODELIST``/``SLURM_JOB_NODELIST`` (``--distributed-port``
  required), or, without a launcher, spawns ``--distributed-world-size`` workers on 127.0.0.1.
  fairseq's GPU-only backends (nccl, pytorch_ddp/c10d) become gloo and legacy_ddp, with one log line.
  Everything is read from fairseq's parsed configuration (``cfg.distributed_training``), so
  ``fairseq-hydra-train`` and ``fairseq_cli.train.main`` callers get the same.
  On every device, a launcher that started N > 1 processes while fairseq would form a world of
  another size (N independent copies, silently) is refused with one line.

* ``cpu_fp16``: ``fairseq-train --cpu --fp16`` (or ``--memory-efficient-fp16``) is refused up front.

  fairseq accepts the flags on CPU, trains in fp16 until the loss scaler's first overflow, then
  dies with "Torch not compiled with CUDA enabled". The refusal is checked where
  ``fairseq-train`` starts its workers (``distributed_utils.call_main``), so code that drives
  fairseq's ``Trainer`` directly (the suite's in-process fp16 tests) is unaffected.

``cpu_fp16`` and ``cpu_launch`` both change ``distributed_utils.call_main``: one :data:`CALL_MAIN`,
whose steps run in the order it lists (the fp16 refusal before any worker is spawned).
"""
import datetime
import functools
import logging
import os
import re
import signal
import socket
import sys
import zlib

import torch
import torch.distributed as dist
from fairseq.distributed import utils as distributed_utils

from fairseq_plugins.errors import ConfigError, PluginError
from fairseq_plugins.network import free_port
from fairseq_plugins.patches._mechanism import Patch, Target, Wrap

logger = logging.getLogger(__name__)
CALL_MAIN = Wrap(Target(distributed_utils, "call_main", "cfg, main, **kwargs"), order=["cpu_fp16", "cpu_launch"])

# -- lost_worker ---------------------------------------------------------------------------------------------------
INIT = Target(distributed_utils, "distributed_init", "cfg")
INIT_PROCESS_GROUP = Target(dist, "init_process_group")  # fairseq's distributed_init calls it by name
MAIN = Target(distributed_utils, "distributed_main", "i, main, cfg, kwargs")

# gloo's own messages (torch's C++, no Python source to check at install) for a peer that is gone
PEER_FAILURES = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Timed out", "timed out",
                 "Connection refused")


class LostWorker(PluginError, RuntimeError):
    """A peer worker died or stopped answering during training."""


class Peers:
    """The workers of one ``distributed_main`` call: [(pid, host id)] by rank, once the process group is up."""

    def __init__(self):
        self.pids = None


def _host_id():
    return zlib.crc32(socket.gethostname().encode())


def _exchange_pids(peers, cfg):
    world = dist.get_world_size()
    mine = torch.tensor([os.getpid(), _host_id()], dtype=torch.int64)
    everyone = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine)
    peers.pids = [tuple(t.tolist()) for t in everyone]
    return cfg


def _gone(pid):
    """Whether process ``pid`` of this host has ended (a zombie counts: its launcher has not reaped it yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def lost_ranks(peers):
    """The ranks known to be gone: on this host, those whose process ended; of two workers, the other."""
    if not peers.pids:
        return []
    me = dist.get_rank() if dist.is_initialized() else None
    here = _host_id()
    gone = [r for r, (pid, host) in enumerate(peers.pids) if r != me and host == here and _gone(pid)]
    if not gone and len(peers.pids) == 2 and me is not None:
        gone = [1 - me]
    return gone


def _report(error, cfg, peers):
    ranks = lost_ranks(peers)
    who = f"rank {', '.join(map(str, ranks))}" if ranks else "a worker on another host"
    cause = next(s for s in PEER_FAILURES if s in str(error))
    save_dir = cfg.checkpoint.save_dir
    return LostWorker(f"lost {who} of {cfg.distributed_training.distributed_world_size} during training "
                      f"(gloo: {cause}); stopped; restart all workers with the same command to resume from "
                      f"{os.path.join(save_dir, 'checkpoint_last.pt')}")


def distributed_init(cfg):
    """fairseq's process-group set-up, with ``--heartbeat-timeout`` as the collectives' timeout."""
    timeout = cfg.distributed_training.heartbeat_timeout
    if timeout <= 0 or dist.is_initialized():
        return INIT(cfg)
    with_timeout = functools.partial(INIT_PROCESS_GROUP, timeout=datetime.timedelta(seconds=timeout))
    with INIT_PROCESS_GROUP.replaced(with_timeout):
        return INIT(cfg)


def distributed_main(i, main, cfg, kwargs):
    peers = Peers()
    chained = kwargs.pop("after_distributed_init_fn", None)
    kwargs["after_distributed_init_fn"] = lambda c: _exchange_pids(peers, chained(c) if chained else c)
    try:
        return MAIN(i, main, cfg, kwargs)
    except RuntimeError as e:
        if isinstance(e, PluginError) or not any(s in str(e) for s in PEER_FAILURES):
            raise
        raise _report(e, cfg, peers) from None


# -- cpu_launch ----------------------------------------------------------------------------------------------------

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)  # what schedulers send; the workers save and stop


def first_host(nodelist):
    """The first host name of a SLURM node list: ``gpu[03-05,9],cpu1`` -> ``gpu03``."""
    match = re.match(r"([^,\[]*)(?:\[([^\]]*)\])?([^,]*)", nodelist.strip())
    prefix, ranges, suffix = match.groups()
    if not prefix and not ranges:
        raise ConfigError(f"SLURM_JOB_NODELIST={nodelist!r}: no host name in it")
    first = re.split(r"[,-]", ranges)[0] if ranges else ""
    return prefix + first + suffix


def _launcher():
    """(name, world size, rank, local rank) the process launcher set, or None."""
    env = os.environ
    if all(key in env for key in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")):
        return "torchrun", int(env["WORLD_SIZE"]), int(env["RANK"]), int(env.get("LOCAL_RANK", 0))
    if "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", 1)) > 1:
        return "SLURM", int(env["SLURM_NTASKS"]), int(env["SLURM_PROCID"]), int(env.get("SLURM_LOCALID", 0))
    return None


def _from_launcher(d, name, world, rank, local_rank):
    if d.distributed_world_size not in (1, world):  # 1 is fairseq's default on a machine without GPUs
        raise ConfigError(f"--distributed-world-size {d.distributed_world_size}: {name} started {world} workers; "
                          "drop the flag (the launcher's count is used)")
    if name == "torchrun":
        d.distributed_init_method = "env://"
    else:
        nodelist = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST")
        if not nodelist:
            raise ConfigError("SLURM_PROCID is set but not SLURM_JOB_NODELIST: run the workers with srun")
        if d.distributed_port <= 0:
            raise ConfigError(f"SLURM job of {world} tasks: pass --distributed-port PORT (a free port on "
                              f"{first_host(nodelist)}, the same for every task)")
        d.distributed_init_method = f"tcp://{first_host(nodelist)}:{d.distributed_port}"
    d.distributed_world_size, d.distributed_rank, d.device_id = world, rank, local_rank
    d.distributed_no_spawn = True


def _cpu_backends(d):
    """fairseq's defaults (nccl, pytorch_ddp) need a GPU per worker: the CPU ones instead."""
    if d.distributed_backend == "nccl":
        logger.info("--cpu: --distributed-backend gloo (nccl needs GPUs)")
        d.distributed_backend = "gloo"
    if d.ddp_backend in ("c10d", "pytorch_ddp"):
        logger.info(f"--cpu: --ddp-backend legacy_ddp ({d.ddp_backend} gives each worker a GPU)")
        d.ddp_backend = "legacy_ddp"


def configure_cpu(cfg):
    """Fill ``cfg.distributed_training`` for a CPU run from the launcher, or for a local spawn."""
    d = cfg.distributed_training
    launcher = _launcher()
    if d.distributed_init_method is None and launcher:
        _from_launcher(d, *launcher)
    elif d.distributed_init_method is None and d.distributed_world_size > 1:
        port = d.distributed_port if d.distributed_port > 0 else free_port()
        d.distributed_init_method = f"tcp://127.0.0.1:{port}"
        d.distributed_no_spawn = False
    elif d.distributed_init_method is not None and not d.distributed_no_spawn and d.distributed_rank:
        raise ConfigError(f"--distributed-rank {d.distributed_rank} without --distributed-no-spawn: on CPU "
                          "start one process per worker (torchrun, srun) or add --distributed-no-spawn")
    if d.distributed_world_size > 1:
        _cpu_backends(d)


def check_world(cfg):
    """Refuse a launch whose processes would each train alone (or form a world of another size)."""
    launcher = _launcher()
    d = cfg.distributed_training
    spawning = d.distributed_init_method is not None and not d.distributed_no_spawn  # fairseq's per-GPU spawn
    if launcher and launcher[1] != d.distributed_world_size and not spawning:
        name, world = launcher[:2]
        raise ConfigError(f"{name} started {world} workers but fairseq would form a world of "
                          f"{d.distributed_world_size} (independent copies): pass --distributed-world-size {world}")


def _spawned(i, main, cfg, kwargs):
    """One spawned worker: the suite's one-line errors instead of a traceback sent to the parent."""
    try:
        distributed_utils.distributed_main(i, main, cfg, kwargs)
    except PluginError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(1)


def spawn(cfg, main, kwargs):
    """fairseq's spawn, one process per CPU worker; signals reach the workers; their status is ours."""
    d = cfg.distributed_training
    kwargs["start_rank"] = d.distributed_rank or 0
    d.distributed_rank = None  # distributed_main numbers the workers start_rank + i
    context = torch.multiprocessing.start_processes(_spawned, args=(main, cfg, kwargs),
                                                    nprocs=d.distributed_world_size, join=False)

    def forward(signum, frame):
        for process in context.processes:
            if process.is_alive():
                os.kill(process.pid, signum)

    previous = {signum: signal.signal(signum, forward) for signum in FORWARDED_SIGNALS}
    try:
        while not context.join():
            pass
    except torch.multiprocessing.ProcessExitedException as e:  # the worker printed its reason
        sys.exit(e.exit_code if e.exit_code > 0 else 128 - e.exit_code)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def call_main(call, cfg, main, **kwargs):
    if cfg.common.cpu or not torch.cuda.is_available():
        configure_cpu(cfg)
    elif cfg.distributed_training.distributed_init_method is None:
        distributed_utils.infer_init_method(cfg.distributed_training)
    check_world(cfg)
    d = cfg.distributed_training
    if (cfg.common.cpu or not torch.cuda.is_available()) and d.distributed_init_method and not d.distributed_no_spawn:
        return spawn(cfg, main, kwargs)
    return call(cfg, main, **kwargs)


# -- cpu_fp16 ------------------------------------------------------------------------------------------------------

def refuse_cpu_fp16(call, cfg, main, **kwargs):
    if cfg.common.cpu or not torch.cuda.is_available():
        for flag in ("memory_efficient_fp16", "fp16"):  # the first implies the second
            if cfg.common.get(flag):
                raise ConfigError(f"--{flag.replace('_', '-')}: fairseq's fp16 training needs a CUDA GPU; on CPU "
                                  "train in fp32, or in bf16 with --criterion label_smoothed_xent --autocast-bf16")
    return call(cfg, main, **kwargs)


PATCHES = [
    Patch("lost_worker", {INIT: distributed_init, MAIN: distributed_main}, scoped=[INIT_PROCESS_GROUP]),
    # requires lost_worker: the spawned workers' one-line errors (_spawned) include a lost peer's
    Patch("cpu_launch", steps={CALL_MAIN: call_main}, requires=["lost_worker"]),
    Patch("cpu_fp16", steps={CALL_MAIN: refuse_cpu_fp16}),
]
