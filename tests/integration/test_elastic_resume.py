"""A run killed mid-epoch resumes on another number of workers (patches/resume.py, elastic_resume).

Every run is CPU gloo workers started as SLURM tasks (1 thread each, --dropout 0, one seed),
under tests/train_probe.py, which records the sentence ids of every batch each worker actually
trains on and kills every worker with SIGKILL right after the save of a chosen update. The
oracle is an uninterrupted run of 2 workers x --update-freq 1; the counts of sentences come from
the recorded batches, not from the code under test. The data is 7 batches per epoch
(--max-tokens 600; checked from the records).
"""
import collections
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from fairseq.data import FairseqDataset, data_utils, iterators
from helpers import ONE_THREAD, REPO, USER_DIR, cli_env, num_updates, slurm_tasks

from fairseq_plugins.checkpoints import load_state
from fairseq_plugins.patches import resume as elastic_resume

PROBE = os.path.join(REPO, "tests", "train_probe.py")
BATCHES = 7  # per epoch
TOTAL = 8  # updates of 2 global batches (the 4th of an epoch has 1): 2 epochs
KILLED_AT = 6  # epoch 2, after 4 of its 7 global batches


def flags(data, save_dir, updates):
    return [data, "--user-dir", USER_DIR, "--arch", "vaswani_transformer_tiny", "--dropout", "0",
            "--criterion", "label_smoothed_xent", "--optimizer", "adam", "--lr", "0.002", "--max-tokens", "600",
            "--max-update", str(updates), "--seed", "1", "--save-dir", save_dir, "--disable-validation",
            "--no-progress-bar", "--log-interval", "1", "--num-workers", "0", "--cpu",
            "--save-interval-updates", "2", "--no-epoch-checkpoints"]


def train(data, save_dir, workers, update_freq, ids, kill_after=None, updates=TOTAL):
    """``workers`` SLURM tasks (or one plain process); returns [(exit status, output)] per worker."""
    env = {**ONE_THREAD, "PROBE_IDS": str(ids), "PYTHONUNBUFFERED": "1"}
    if kill_after:
        env["PROBE_KILL_AFTER"] = str(kill_after)
    return slurm_tasks([sys.executable, PROBE, *flags(data, save_dir, updates), "--update-freq", update_freq], workers, env)


def batches(ids, until=None):
    """{epoch: [(update, sorted ids of one batch), ...]} from the probe's files of every worker."""
    found = collections.defaultdict(list)
    folder, prefix = os.path.split(str(ids))
    for name in sorted(os.listdir(folder)):
        if name.startswith(prefix + ".rank"):
            for line in open(os.path.join(folder, name)):
                epoch, update, batch = line.split()
                if until is None or int(update) <= until:
                    found[int(epoch)].append((int(update), tuple(sorted(map(int, batch.split(","))))))
    return found


def per_update(epoch_batches):
    """{update: sorted ids of all its batches}: the global batch of each update."""
    merged = collections.defaultdict(list)
    for update, batch in epoch_batches:
        merged[update].extend(batch)
    return {update: sorted(ids) for update, ids in merged.items()}


def train_sentences(data):
    return len(data_utils.load_indexed_dataset(os.path.join(data, "train.src-tgt.src"), None))


def assert_every_sentence_once(runs, epoch, sentences):
    seen = collections.Counter(i for found in runs for _, batch in found.get(epoch, []) for i in batch)
    twice, missing = sorted(i for i, n in seen.items() if n > 1), sorted(set(range(sentences)) - set(seen))
    assert not twice and not missing, f"epoch {epoch}: seen twice {twice[:10]}, never {missing[:10]}"


def assert_killed(result):
    assert [code for code, _ in result] == [-signal.SIGKILL] * len(result), result[0][1][-3000:]


def assert_trained(result):
    assert [code for code, _ in result] == [0] * len(result), result[0][1][-3000:]
    return result[0][1]


def assert_same_weights(path, reference, exact):
    a, b = load_state(reference), load_state(path)
    assert num_updates(a) == num_updates(b) == TOTAL
    for name in a["model"]:
        diff = (a["model"][name] - b["model"][name]).abs().max().item()
        assert diff <= 1e-6, f"{name}: max |difference| {diff}"
        if exact:
            assert torch.equal(a["model"][name], b["model"][name]), f"{name}: max |difference| {diff}"


class _Ids(FairseqDataset):
    """Sentence i is the number i: a batch is the list of its ids."""

    def __init__(self, n):
        self.n = n

    def __getitem__(self, i):
        return i

    def __len__(self):
        return self.n

    def collater(self, samples):
        return list(samples)


IDS = _Ids(23)
ID_BATCHES = [list(range(i, min(i + 2, 23))) for i in range(0, 23, 2)]  # 12 batches, the last of one sentence


def id_iterator(shards, shard, seed=1):
    return iterators.EpochBatchIterator(IDS, IDS.collater, ID_BATCHES, seed=seed, num_shards=shards, shard_id=shard)


def consume(shards, steps):
    """Each of ``shards`` workers takes ``steps`` batches of epoch 1: (batches taken, worker 0's state)."""
    taken, state = [], None
    for shard in range(shards):
        iterator = id_iterator(shards, shard)
        epoch = iterator.next_epoch_itr(shuffle=True)
        taken += [next(epoch) for _ in range(steps)]
        state = state or iterator.state_dict()
    return taken, state


def resume(state, shards, seed=1, then=None):
    """What each of ``shards`` workers resumed from ``state`` takes in the rest of the epoch (and,
    into ``then``, in the whole next epoch)."""
    rest = []
    for shard in range(shards):
        iterator = id_iterator(shards, shard, seed)
        iterator.load_state_dict(state)
        rest.append(list(iterator.next_epoch_itr(shuffle=True)))
        if then is not None:
            then.append(list(iterator.next_epoch_itr(shuffle=True)))
    return rest


@pytest.mark.parametrize("before, steps, after", [(2, 2, 1), (2, 2, 3), (1, 3, 2), (3, 1, 2), (2, 3, 2)])
def test_an_iterator_resumed_on_other_workers_takes_the_rest_of_the_uninterrupted_order(before, steps, after):
    """In process, fairseq's EpochBatchIterator alone (no training): the oracle is the epoch's order
    as one uninterrupted worker takes it. The old workers took its first before x steps batches;
    the new workers, step by step, take the rest in that order (fairseq pads a short shard with
    empty batches), then the whole next epoch in its own order; the state counts the global
    batches and sentences consumed."""
    uninterrupted = id_iterator(1, 0)
    whole, second = (list(uninterrupted.next_epoch_itr(shuffle=True)) for _ in range(2))
    consumed = before * steps
    taken, state = consume(before, steps)
    assert sorted(taken) == sorted(whole[:consumed])
    assert (state["global_batches_consumed"], state["global_batches"]) == (consumed, len(whole))
    assert (state["samples_consumed"], state["samples"]) == (sum(map(len, whole[:consumed])), 23)
    next_epoch = []
    rest = resume(state, after, then=next_epoch)
    in_order = [batch for step in zip(*rest) for batch in step if batch]
    assert in_order == whole[consumed:]
    assert [batch for step in zip(*next_epoch) for batch in step if batch] == second  # the next epoch is whole
    assert sum(map(len, rest)) == -(-len(whole[consumed:]) // after) * after  # every worker takes as many steps


def test_an_iterator_resumed_into_another_order_says_so_once_and_resumes_as_fairseq_does(caplog):
    """Another --seed shuffles the epoch otherwise: one warning, and each worker skips the batches
    of its own shard that the state counts, as fairseq does without the patch."""
    _, state = consume(2, 3)
    with caplog.at_level(logging.WARNING):
        rest = resume(state, 2, seed=2)
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 2  # one per worker
    assert "its position cannot be found exactly; resuming at batch 3 of each worker" in caplog.records[0].message
    for shard in range(2):
        assert rest[shard] == list(id_iterator(2, shard, seed=2).next_epoch_itr(shuffle=True))[3:]


def test_the_state_at_the_end_of_an_epoch_is_fairseqs():
    """Workers that took their whole epoch save fairseq's own state (the next epoch, none of it
    consumed), which any number of workers resumes with the whole next epoch."""
    taken, state = consume(2, len(ID_BATCHES) // 2)
    assert len(taken) == len(ID_BATCHES)
    assert state == {"version": 2, "epoch": 2, "iterations_in_epoch": 0, "shuffle": True}
    uninterrupted = id_iterator(1, 0)
    second = [list(uninterrupted.next_epoch_itr(shuffle=True)) for _ in range(2)][1]
    for workers in (1, 3):
        rest = resume(state, workers)
        assert [batch for step in zip(*rest) for batch in step if batch] == second


def test_grouped_shuffling_resumes_on_as_many_workers_as_fairseq_does():
    """--grouped-shuffling shuffles groups of as many batches as workers, so the order depends on
    their number: resumed after 2 steps on the same 2 workers, each takes the rest of its own list."""
    def iterator(shard):
        return iterators.EpochBatchIterator(IDS, IDS.collater, ID_BATCHES, seed=1, num_shards=2, shard_id=shard,
                                            grouped_shuffling=True)

    state = None
    for shard in range(2):
        first = iterator(shard)
        epoch = first.next_epoch_itr(shuffle=True)
        for _ in range(2):
            next(epoch)
        state = state or first.state_dict()
    for shard in range(2):
        resumed = iterator(shard)
        resumed.load_state_dict(state)
        assert list(resumed.next_epoch_itr(shuffle=True)) == list(iterator(shard).next_epoch_itr(shuffle=True))[2:]


def test_another_order_of_batches_of_one_size_is_seen_too(caplog):
    """24 sentences in batches of 2: another --seed reorders batches that all have the same size,
    so only their sentences tell the orders apart; the resume still says so and falls back."""
    ids = _Ids(24)
    pairs = [[i, i + 1] for i in range(0, 24, 2)]

    def iterator(seed):
        return iterators.EpochBatchIterator(ids, ids.collater, pairs, seed=seed, num_shards=2, shard_id=0)

    first = iterator(1)
    epoch = first.next_epoch_itr(shuffle=True)
    for _ in range(3):
        next(epoch)
    state = first.state_dict()
    resumed = iterator(2)
    with caplog.at_level(logging.WARNING):
        resumed.load_state_dict(state)
    assert "its position cannot be found exactly; resuming at batch 3 of each worker" in caplog.text
    assert list(resumed.next_epoch_itr(shuffle=True)) == list(iterator(2).next_epoch_itr(shuffle=True))[3:]


def test_a_state_fairseq_wrote_without_the_suite_resumes_as_fairseq_does():
    """A checkpoint of a run without the suite holds fairseq's own iterator state (no record of the
    order): each worker skips the batches of its own shard that the state counts."""
    state = {"version": 2, "epoch": 1, "iterations_in_epoch": 3, "shuffle": True}
    rest = resume(state, 2)
    for shard in range(2):
        assert rest[shard] == list(id_iterator(2, shard).next_epoch_itr(shuffle=True))[3:]


def test_the_resume_line_says_whether_the_updates_group_the_same_batches(caplog):
    """In process, the patch's load_checkpoint over a stand-in for fairseq's (returning the resumed
    iterator): a state saved by 2 workers x --update-freq 1 after 2 steps, resumed with as many
    batches per update, fewer and more; and a state that did not record --update-freq."""
    def config(update_freq):
        return SimpleNamespace(optimization=SimpleNamespace(update_freq=[update_freq]))

    fairseqs_save = lambda trainer, filename, extra_state: None  # noqa: E731
    _, state = consume(2, 2)
    unrecorded = dict(state)
    elastic_resume.save_update_freq(fairseqs_save, SimpleNamespace(cfg=config(1)), "checkpoint.pt", {"train_iterator": state})
    assert state["update_freq"] == 1 and "update_freq" not in unrecorded

    def line(state, workers, update_freq):
        iterator = id_iterator(workers, 0)
        iterator.load_state_dict(state)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=elastic_resume.__name__):
            elastic_resume.say_how_the_epoch_goes_on(lambda cfg, trainer, **kwargs: ({}, iterator), config(update_freq),
                                                     SimpleNamespace(cfg=config(update_freq)))
        [message] = caplog.messages
        start = "resumed epoch 1 after 4 of its 12 global batches (8 of 23 sentences), written by "
        assert message.startswith(start), message
        return message[len(start):]

    same = "per update as before: the same global batches as an uninterrupted run"
    other = "an exact continuation is impossible (the updates group other batches); every remaining sentence of " \
            "the epoch is still seen once"
    assert line(state, 1, 2) == f"2 workers x --update-freq 1; the remaining 8 batches are split among 1 worker x " \
                                f"--update-freq 2, 2 {same}"
    assert line(state, 3, 1) == f"2 workers x --update-freq 1; the remaining 8 batches are split among 3 workers x " \
                                f"--update-freq 1, 3 per update instead of 2: {other}"
    assert line(state, 1, 1).endswith(f"split among 1 worker x --update-freq 1, 1 per update instead of 2: {other}")
    assert line(unrecorded, 2, 1) == f"2 workers x --update-freq ?; the remaining 8 batches are split among 2 " \
                                     f"workers x --update-freq 1, 2 per update instead of an unknown count: {other}"


def test_a_save_records_the_update_freq_of_its_epoch():
    """fairseq's per-epoch --update-freq 3,1 (its last value for every later epoch): a mid-epoch
    state of epoch 1, 2 or 5 records 3, 1, 1."""
    trainer = SimpleNamespace(cfg=SimpleNamespace(optimization=SimpleNamespace(update_freq=[3, 1])))
    recorded = []
    for epoch in (1, 2, 5):
        state = {"epoch": epoch, elastic_resume.CONSUMED: 2}
        elastic_resume.save_update_freq(lambda trainer, filename, extra_state: None, trainer, "checkpoint.pt",
                                        {"train_iterator": state})
        recorded.append(state["update_freq"])
    assert recorded == [3, 1, 1]


def test_a_save_without_an_iterator_state_is_fairseqs():
    """A program of its own that saves through Trainer.save_checkpoint with no iterator state in
    ``extra_state`` gets fairseq's save, the state untouched (no --update-freq to record)."""
    saved = []
    fairseqs_save = lambda trainer, filename, extra_state: saved.append(extra_state)  # noqa: E731
    for extra_state in ({}, None, {"train_iterator": {"epoch": 1, "iterations_in_epoch": 2}}):
        elastic_resume.save_update_freq(fairseqs_save, SimpleNamespace(), "checkpoint.pt", extra_state)
    assert saved == [{}, None, {"train_iterator": {"epoch": 1, "iterations_in_epoch": 2}}]


def test_at_an_epoch_boundary_the_state_is_fairseqs():
    iterator = id_iterator(2, 0)
    iterator.next_epoch_itr(shuffle=True)
    assert "global_batches_consumed" not in iterator.state_dict()


@pytest.fixture(scope="module")
def reference(data_bin, tmp_path_factory):
    """The uninterrupted run: 2 workers x --update-freq 1, TOTAL updates; (checkpoint, its batches)."""
    root = tmp_path_factory.mktemp("reference")
    assert_trained(train(data_bin, str(root / "save"), 2, 1, root / "ids"))
    return str(root / "save" / "checkpoint_last.pt"), batches(root / "ids")


RESUMED = re.compile(r"resumed epoch (\d+) after (\d+) of its (\d+) global batches \((\d+) of (\d+) sentences\), "
                     r"written by (\d+) workers? x --update-freq (\d+); the remaining (\d+) batches are split among "
                     r"(\d+) workers? x --update-freq (\d+), (.*)$", re.M)
WORKERS = {1: "1 worker", 2: "2 workers"}  # as the line says them


@pytest.mark.slow
@pytest.mark.parametrize("before, after", [((2, 1), (1, 2)), ((1, 2), (2, 1))], ids=["2x1 to 1x2", "1x2 to 2x1"])
def test_a_kill_mid_epoch_resumed_on_other_workers_follows_the_uninterrupted_run(data_bin, reference, tmp_path,
                                                                                  before, after):
    """Same global batch (2 per update), other workers: the resumed run trains on the same global
    batches, update by update, as the uninterrupted one, sees every sentence once per epoch, and
    ends with the same weights. Bit-equal: a global batch's gradient is the sum of its two batches'
    gradients either way (gloo's all-reduce of 2 workers or fairseq's accumulation in one process,
    a + b), as tests/integration/test_cluster.py shows for uninterrupted runs."""
    save, killed_ids, resumed_ids = str(tmp_path / "save"), tmp_path / "killed", tmp_path / "resumed"
    assert_killed(train(data_bin, save, *before, killed_ids, kill_after=KILLED_AT))
    assert num_updates(load_state(os.path.join(save, "checkpoint_last.pt"))) == KILLED_AT
    log = assert_trained(train(data_bin, save, *after, resumed_ids))

    line = RESUMED.search(log)
    assert line, log[-3000:]
    assert line.groups()[:3] == ("2", "4", str(BATCHES))
    assert line.groups()[5:10] == (*map(str, before), str(BATCHES - 4), *map(str, after))
    assert (f"written by {WORKERS[before[0]]} x --update-freq {before[1]}; " in line.group(0)
            and f"split among {WORKERS[after[0]]} x --update-freq {after[1]}, " in line.group(0)), line.group(0)
    assert line.group(11) == "2 per update as before: the same global batches as an uninterrupted run"
    ref_checkpoint, ref_batches = reference
    runs = [batches(killed_ids, until=KILLED_AT), batches(resumed_ids)]
    sentences = train_sentences(data_bin)
    assert len(ref_batches[1]) == len(ref_batches[2]) == BATCHES
    for epoch in (1, 2):
        assert_every_sentence_once(runs, epoch, sentences)
        combined = per_update(runs[0].get(epoch, []) + runs[1].get(epoch, []))
        assert combined == per_update(ref_batches[epoch])
    # the line's counts: the sentences consumed, of all the epoch's sentences
    assert (int(line.group(4)), int(line.group(5))) == (sum(len(b) for _, b in runs[0][2]), sentences)
    assert_same_weights(os.path.join(save, "checkpoint_last.pt"), ref_checkpoint, exact=True)


@pytest.mark.slow
def test_three_workers_resumed_on_two_see_every_sentence_once_and_say_the_continuation_is_not_exact(data_bin,
                                                                                                     tmp_path):
    """3 workers x 1 -> 2 workers x 1: no update of 2 workers consumes 3 global batches, so the
    updates group the remaining batches otherwise (one line says so); every sentence of the epoch
    is still seen exactly once. 7 batches: 3 updates per epoch for 3 workers; killed after update
    4, 3 batches into epoch 2; the 4 left take 2 updates of 2 workers."""
    save, killed_ids, resumed_ids = str(tmp_path / "save"), tmp_path / "killed", tmp_path / "resumed"
    assert_killed(train(data_bin, save, 3, 1, killed_ids, kill_after=4))
    log = assert_trained(train(data_bin, save, 2, 1, resumed_ids, updates=6))
    line = RESUMED.search(log)
    assert line, log[-3000:]
    assert line.groups()[:3] == ("2", "3", str(BATCHES)) and line.groups()[5:10] == ("3", "1", "4", "2", "1")
    assert "written by 3 workers x --update-freq 1; " in line.group(0), line.group(0)
    assert line.group(11).startswith("2 per update instead of 3: an exact continuation is impossible")
    runs = [batches(killed_ids, until=4), batches(resumed_ids)]
    sentences = train_sentences(data_bin)
    for epoch in (1, 2):
        assert_every_sentence_once(runs, epoch, sentences)
    assert (int(line.group(4)), int(line.group(5))) == (sum(len(b) for _, b in runs[0][2]), sentences)
    assert len(runs[0][1]) == BATCHES
    assert sorted({update for update, _ in runs[1][2]}) == [5, 6]
    assert num_updates(load_state(os.path.join(save, "checkpoint_last.pt"))) == 6


OTHER_ORDER = ("the checkpoint's epoch 2 was shuffled into other batches than this run makes (other data, "
               "--max-tokens, --seed or batching flags): its position cannot be found exactly; resuming at batch 2 "
               "of each worker as fairseq does, so some batches of this epoch may be seen twice or not at all")


@pytest.mark.slow
@pytest.mark.parametrize("changed", [["--seed", "2"], ["--max-tokens", "500"]], ids=lambda flag: flag[0])
def test_a_resume_into_another_batch_order_says_so_in_one_line_and_resumes_as_fairseq_does(data_bin, reference,
                                                                                            tmp_path, changed):
    """The uninterrupted run's save of update 6 (epoch 2, 4 of its 7 global batches consumed by 2
    workers) resumed by 1 worker x --update-freq 2 with another --seed or --max-tokens: the epoch's
    order cannot be rebuilt, so one warning line, and fairseq's resume at the count of batches each
    worker consumed (2): the worker trains all but 2 of the epoch's batches (counted from its next
    epoch's, which no resume touches), not the 3 an exact position would leave."""
    save, ids = tmp_path / "save", tmp_path / "resumed"
    save.mkdir()
    shutil.copy(os.path.join(os.path.dirname(reference[0]), "checkpoint_2_6.pt"), save / "checkpoint_last.pt")
    cmd = [sys.executable, PROBE, *flags(data_bin, str(save), 100), "--update-freq", "2", "--max-epoch", "3", *changed]
    proc = subprocess.run(cmd, env=cli_env({**ONE_THREAD, "PROBE_IDS": str(ids)}), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600)
    assert proc.returncode == 0 and "@ 6 updates)" in proc.stdout, proc.stdout[-3000:]
    warnings = [line for line in proc.stdout.splitlines() if OTHER_ORDER in line]
    assert len(warnings) == 1 and warnings[0].endswith(OTHER_ORDER) and not RESUMED.search(proc.stdout), \
        proc.stdout[-3000:]
    found = batches(ids)
    assert len(found[2]) == len(found[3]) - 2, {epoch: len(b) for epoch, b in found.items()}
