"""Shared pieces of the patch groups' tests: one behaviour out for a block, a tiny model."""
import contextlib

import pytest
import torch
import fairseq
from fairseq import options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from fairseq_plugins import patches


OFFICIAL_0_12_2 = fairseq.__version__ == "0.12.2"  # the PyPI release, below Python 3.11 (docs/INSTALL.md)


@contextlib.contextmanager
def out(name):
    """Patch ``name`` (and the patches that require it) uninstalled for the block, then installed again."""
    before = [n for n, p in patches.PATCHES.items() if p.installed]
    assert name in before
    patches.uninstall(name)
    try:
        yield
    finally:
        for n in before:
            patches.install(n)
        assert all(patches.PATCHES[n].installed for n in before)


@pytest.fixture(scope="module")
def tiny(data_bin):
    """(cfg, task, model, sample): an untrained vaswani_transformer_tiny on ``data_bin`` and 4 validation sentences."""
    args = options.parse_args_and_arch(options.get_training_parser(), [
        data_bin, "--arch", "vaswani_transformer_tiny", "--encoder-layers", "1", "--decoder-layers", "1",
        "--optimizer", "adam", "--lr", "1e-3", "--cpu", "--seed", "1", "--max-tokens", "500"])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("valid")
    torch.manual_seed(1)
    model = task.build_model(cfg.model).eval()
    model.prepare_for_inference_(cfg)  # as fairseq-generate and the hub do: attention only on demand
    dataset = task.dataset("valid")
    sample = dataset.collater([dataset[i] for i in range(4)])
    return cfg, task, model, sample


def slurm_cfg(data_bin, *flags):
    args = options.parse_args_and_arch(options.get_training_parser(), [
        data_bin, "--arch", "rnnsearch_tiny", "--optimizer", "adam", "--lr", "1e-3", "--cpu", *flags])
    return convert_namespace_to_omegaconf(args)
