"""patches/launch.py: starting and losing workers, with the behaviours out and in."""
import datetime

import pytest
import torch
from fairseq.distributed import utils as distributed_utils
from patching import out, slurm_cfg

from fairseq_plugins.errors import ConfigError
from fairseq_plugins.network import free_port


def test_cpu_launch(data_bin, monkeypatch):
    """Two SLURM tasks on CPU: fairseq makes each an independent world of 1; the suite joins them."""
    for key, value in {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0",
                       "SLURM_JOB_NODELIST": "node[3-4]"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PATH", "/nonexistent")  # no scontrol
    started = []
    monkeypatch.setattr(distributed_utils, "distributed_main",
                        lambda i, main, cfg, kwargs: started.append(("worker", cfg.distributed_training)))

    def main(cfg, **kwargs):
        started.append(("alone", cfg.distributed_training))
    with out("cpu_launch"):
        distributed_utils.call_main(slurm_cfg(data_bin, "--distributed-port", "12345"), main)
        assert started[-1][0] == "alone" and started[-1][1].distributed_world_size == 1
    distributed_utils.call_main(slurm_cfg(data_bin, "--distributed-port", "12345"), main)
    kind, d = started[-1]
    assert (kind, d.distributed_world_size, d.distributed_init_method, d.distributed_backend, d.ddp_backend) == (
        "worker", 2, "tcp://node3:12345", "gloo", "legacy_ddp")


def test_cpu_fp16(data_bin):
    ran = []
    with out("cpu_fp16"):
        distributed_utils.call_main(slurm_cfg(data_bin, "--fp16"), lambda cfg, **kw: ran.append(cfg))
        assert len(ran) == 1  # fairseq trains in fp16 on CPU until the first overflow
    with pytest.raises(ConfigError, match="^--fp16: fairseq's fp16 training needs a CUDA GPU"):
        distributed_utils.call_main(slurm_cfg(data_bin, "--fp16"), lambda cfg, **kw: ran.append(cfg))


def test_lost_worker(data_bin, monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")

    def dies(cfg, **kwargs):
        raise RuntimeError("[gloo] Connection closed by peer [127.0.0.1]:1234")

    def run():
        cfg = slurm_cfg(data_bin, "--distributed-world-size", "1", "--distributed-backend", "gloo",
                        "--distributed-init-method", f"tcp://127.0.0.1:{free_port()}")
        try:
            distributed_utils.distributed_main(0, dies, cfg, {})
        finally:
            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()
    with out("lost_worker"):
        with pytest.raises(RuntimeError, match=r"^\[gloo\] Connection closed by peer"):
            run()
    with pytest.raises(RuntimeError, match=r"^lost a worker on another host of 1 during training \(gloo: Connection "
                                           r"closed by peer\); stopped; restart all workers"):
        run()


def test_heartbeat_timeout_reaches_init_process_group_which_is_left_as_found(data_bin, monkeypatch):
    """--heartbeat-timeout S: the process group's timeout, through a torch.distributed.init_process_group
    installed after the suite (kept afterwards, as found)."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    timeouts, real = [], torch.distributed.init_process_group

    def recording(*args, **kwargs):
        timeouts.append(kwargs.get("timeout"))
        return real(*args, **kwargs)
    monkeypatch.setattr(torch.distributed, "init_process_group", recording)
    cfg = slurm_cfg(data_bin, "--distributed-world-size", "1", "--distributed-backend", "gloo", "--heartbeat-timeout",
                    "17", "--distributed-init-method", f"tcp://127.0.0.1:{free_port()}")
    try:
        distributed_utils.distributed_init(cfg)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    assert timeouts == [datetime.timedelta(seconds=17)]
    assert torch.distributed.init_process_group is recording
