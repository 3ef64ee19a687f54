"""Data-parallel training through fairseq's own trainer: 2 CPU workers (gloo, loopback, started
by ``fairseq-train --distributed-world-size 2 --cpu``) against 1 process with ``--update-freq 2``.
The other launchers (torchrun, SLURM), preemption and lost workers: tests/integration/test_cluster.py.

Why the parameters must be *exactly* equal (tolerance 0): with ``--dropout 0`` and one seed,
both runs see the same batches (rank r of 2 reads batches r, r+2, ... of each epoch's
shuffled list; one process with ``--update-freq 2`` reads them in pairs), compute each
batch's gradient with the same kernels on one thread (``OMP_NUM_THREADS=1`` everywhere:
a different thread count changes the summation order inside matrix products), and add the
two gradients with one float addition, which is commutative. fairseq then divides by the
summed sample size in both runs (legacy_ddp's division by the world size and the
trainer's multiplication by it are exact powers of two). A float tolerance would not make
sense here anyway: Adam divides by √v, so a last-bit difference in a near-zero gradient
moves a weight by up to the learning rate (seen: 1e-3 after 4 updates with 1 vs 2 threads).
"""
import os
import shutil

import pytest
import torch
from fairseq import checkpoint_utils
from helpers import ONE_THREAD, USER_DIR, run

FAMILIES = ["vaswani_transformer_tiny", "rnnsearch_tiny", "rnnencdec_tiny", "seq2seq_lstm_tiny"]
RESUMED = "vaswani_transformer_tiny"  # the family whose 2-worker checkpoint is resumed in 1 process


def train_flags(data, arch, save_dir, max_epoch):
    # --max-tokens 600 gives 3-4 updates per epoch of the embedded corpus (2 x 600 tokens each).
    return [data, "--user-dir", USER_DIR, "--arch", arch, "--dropout", "0", "--criterion", "label_smoothed_xent",
            "--optimizer", "adam", "--lr", "0.002", "--max-tokens", "600", "--max-epoch", str(max_epoch), "--seed", "1",
            "--save-dir", save_dir, "--disable-validation", "--no-progress-bar", "--log-interval", "1",
            "--num-workers", "0"]


def load(path):
    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    return state["model"], state["optimizer_history"][-1]["num_updates"]


def assert_same_parameters(path_a, path_b):
    (a, updates_a), (b, updates_b) = load(path_a), load(path_b)
    assert updates_a == updates_b > 0
    assert a.keys() == b.keys()
    for name in a:
        diff = (a[name].float() - b[name].float()).abs().max().item()
        assert torch.equal(a[name], b[name]), f"{name}: max |difference| {diff}"


@pytest.fixture(scope="module")
def runs(data_bin, tmp_path_factory):
    """``runs(arch)`` -> (one-process save dir, two-worker save dir, two-worker log): 1 epoch each, trained once."""
    done = {}

    def get(arch):
        if arch not in done:
            root = tmp_path_factory.mktemp(arch)
            one, two = str(root / "one"), str(root / "two")
            run(["fairseq-train", *train_flags(data_bin, arch, one, 1), "--cpu", "--update-freq", "2"],
                env=ONE_THREAD)
            log = run(["fairseq-train", *train_flags(data_bin, arch, two, 1), "--cpu", "--distributed-world-size", "2"],
                      env=ONE_THREAD)
            done[arch] = one, two, log
        return done[arch]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("arch", FAMILIES)
def test_two_workers_equal_one_process_with_update_freq_2(runs, arch):
    one, two, log = runs(arch)
    assert "distributed init (rank 0)" in log and "distributed init (rank 1)" in log
    assert_same_parameters(os.path.join(one, "checkpoint1.pt"), os.path.join(two, "checkpoint1.pt"))


@pytest.mark.slow
def test_two_worker_checkpoint_resumes_in_one_process(runs, data_bin, tmp_path):
    one, two, _ = runs(RESUMED)
    # The 2-worker checkpoint holds what the 1-process one holds: weights, Adam's moments and
    # step counts, the data iterator's position, so resuming either is the same computation.
    a, b = (checkpoint_utils.load_checkpoint_to_cpu(os.path.join(d, "checkpoint1.pt")) for d in (one, two))
    assert a["extra_state"]["train_iterator"] == b["extra_state"]["train_iterator"]
    opt_a, opt_b = a["last_optimizer_state"], b["last_optimizer_state"]
    assert opt_a["param_groups"] == opt_b["param_groups"] and opt_a["state"].keys() == opt_b["state"].keys()
    for i, state in opt_a["state"].items():
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(opt_b["state"][i][key])), (i, key)

    updates = b["optimizer_history"][-1]["num_updates"]
    resumed = str(tmp_path / "resumed")
    shutil.copytree(two, resumed)
    log = run(["fairseq-train", *train_flags(data_bin, RESUMED, resumed, 2), "--cpu", "--update-freq", "2"],
              env=ONE_THREAD)
    assert f"(epoch 2 @ {updates} updates)" in log  # fairseq's "Loaded checkpoint" line
    assert f"num_updates={updates + 1}," in log  # the count continues
    _, final_updates = load(os.path.join(resumed, "checkpoint2.pt"))
    assert final_updates == 2 * updates  # a second epoch of as many updates as the first
