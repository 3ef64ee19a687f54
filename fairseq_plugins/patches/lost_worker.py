"""A worker that dies never leaves the others waiting: they stop with one line naming it.

With gloo, a worker killed during training makes its peers' next collective fail
("Connection closed by peer", a traceback from inside torch), and a worker that hangs without
dying (stopped, or its machine unreachable) makes them wait for the process group's timeout,
30 minutes by default. Here:

* at start-up the workers exchange their process ids and host ids (one all-gather of integers);
* a collective that fails becomes :class:`LostWorker`, one line naming the lost rank (a rank on
  this host whose process is gone; with two workers, the other one) and where a restart resumes;
* fairseq's ``--heartbeat-timeout S`` (otherwise only a watchdog on the forward pass) also
  becomes the process group's timeout, so a silent peer ends the run after S seconds.
"""
import datetime
import functools
import os
import socket
import zlib

import torch
import torch.distributed as dist
from fairseq.distributed import utils as distributed_utils

from fairseq_plugins.errors import PluginError
from fairseq_plugins.patches._mechanism import Patch, Target

INIT = Target(distributed_utils, "distributed_init", "cfg")
INIT_PROCESS_GROUP = Target(dist, "init_process_group")  # fairseq's distributed_init calls it by name
MAIN = Target(distributed_utils, "distributed_main", "i, main, cfg, kwargs")

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


PATCH = Patch(__name__, {INIT: distributed_init, MAIN: distributed_main}, scoped=[INIT_PROCESS_GROUP])
