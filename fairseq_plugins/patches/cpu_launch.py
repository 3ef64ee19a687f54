"""Multi-worker ``fairseq-train --cpu`` started the way users start it: torchrun, SLURM, spawn.

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
"""
import logging
import os
import re
import signal
import sys

import torch
from fairseq.distributed import utils as distributed_utils

from fairseq_plugins.errors import ConfigError, PluginError
from fairseq_plugins.network import free_port
from fairseq_plugins.patches._mechanism import Patch, Target

logger = logging.getLogger(__name__)
CALL_MAIN = Target(distributed_utils, "call_main", "cfg, main, **kwargs")
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


def call_main(cfg, main, **kwargs):
    if cfg.common.cpu or not torch.cuda.is_available():
        configure_cpu(cfg)
    elif cfg.distributed_training.distributed_init_method is None:
        distributed_utils.infer_init_method(cfg.distributed_training)
    check_world(cfg)
    d = cfg.distributed_training
    if (cfg.common.cpu or not torch.cuda.is_available()) and d.distributed_init_method and not d.distributed_no_spawn:
        return spawn(cfg, main, kwargs)
    return CALL_MAIN(cfg, main, **kwargs)


# requires lost_worker: the spawned workers' one-line errors (_spawned) include a lost peer's
PATCH = Patch(__name__, {CALL_MAIN: call_main}, requires=["lost_worker"])
