"""Reliability: kill -9 and resume, full disk, corrupt and hostile checkpoints, bad corpora,
numerical faults. Every test drives the real command-line tools (see docs/RELIABILITY.md). The
in-process pieces: tests/unit/test_atomic_write.py, tests/unit/patches/test_resume.py and
tests/integration/test_clean_exit.py.
"""
import glob
import hashlib
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import helpers
import pytest
import torch
from helpers import (TINY_BUILTIN_TRANSFORMER, USER_DIR, cli_env, first_non_finite_module, needs_native_bf16,
                     num_updates, run)
from omegaconf import OmegaConf

from fairseq_plugins.checkpoints import load_state, save_state
from fairseq_plugins.errors import CheckpointError

SUITE_TRAINING = ["--criterion", "label_smoothed_xent", "--label-smoothing", "0.1", "--lr-scheduler",
                  "inverse_sqrt_warmup", "--warmup-updates", "4", "--optimizer", "adam", "--lr", "0.002"]
# One thread per trainer: the runs are small, and two cores are shared by the whole suite.
ONE_THREAD = {**helpers.ONE_THREAD, "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def train_cmd(data, save_dir, max_update, *extra, arch=TINY_BUILTIN_TRANSFORMER):
    cmd = ["fairseq-train", data, "--user-dir", USER_DIR, *arch, *SUITE_TRAINING, "--max-tokens", 500,
           "--max-update", max_update, "--save-dir", save_dir, "--cpu", "--seed", 1, "--no-progress-bar",
           "--log-interval", 1, "--num-workers", 0, *extra]
    return [str(a) for a in cmd]


def run_failing(cmd, **popen):
    """Run ``cmd``; it must fail. Return its stdout+stderr."""
    proc = subprocess.run([str(c) for c in cmd], env=cli_env(ONE_THREAD), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, **popen)
    assert proc.returncode != 0, f"{' '.join(map(str, cmd))} succeeded:\n{proc.stdout[-3000:]}"
    return proc.stdout


def last_line(output):
    return output.strip().splitlines()[-1]


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def assert_same(a, b, where="checkpoint"):
    """Bitwise equality of nested checkpoint entries (tensors with torch.equal)."""
    if torch.is_tensor(a):
        assert torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b), f"{where} differs"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: keys differ"
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


# ------------------------------------------------------------------ atomic writes (the writer killed)
# The in-process tests of the atomic write: tests/unit/test_atomic_write.py.


@pytest.mark.slow
def test_kill_9_in_the_middle_of_a_write_leaves_the_previous_file(tmp_path):
    """The writer is killed (SIGKILL, no cleanup possible) after half of the bytes are out."""
    target = tmp_path / "checkpoint_last.pt"
    torch.save({"old": torch.zeros(3)}, target)
    before = sha256(target)
    child = (
        "import os, signal, sys\n"
        "from fairseq_plugins.checkpoints import atomic_write\n"
        "with atomic_write(sys.argv[1]) as f:\n"
        "    f.write(b'x' * 100000); f.flush()\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", child, str(target)], env=cli_env())
    assert proc.returncode == -signal.SIGKILL
    (tmp,) = glob.glob(str(target) + ".*.tmp")
    assert os.path.getsize(tmp) == 100000  # the kill came mid-save
    assert sha256(target) == before
    assert torch.equal(torch.load(target)["old"], torch.zeros(3))


# ------------------------------------------------------------------ 1. kill -9 and resume

# Runs fairseq-train in this process after slowing down one thing: the copy onto
# checkpoint_last.pt's temporary file writes 64 KiB, then stalls, so that the test can kill -9 the trainer
# with a half-written temporary file on disk. The kill itself is real.
STALL_ON_LAST_CHECKPOINT_COPY = """
import os, shutil, sys, time
from fairseq_cli.train import cli_main
copyfileobj = shutil.copyfileobj
def stalling_copyfileobj(src, dst, length=0):
    if os.path.basename(dst.name).startswith("checkpoint_last.pt.") and dst.name.endswith(".tmp"):
        dst.write(src.read(1 << 16)); dst.flush(); time.sleep(300)
    copyfileobj(src, dst, length)
shutil.copyfileobj = stalling_copyfileobj
sys.argv[0] = "fairseq-train"
cli_main()
"""


def run_until_killed(cmd, kill_when, timeout=240):
    """Start ``cmd``; kill -9 it once ``kill_when(log_lines)`` holds. Return whether it was killed."""
    proc = subprocess.Popen(cmd, env=cli_env(ONE_THREAD), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None:
            assert time.monotonic() < deadline, "trainer neither finished nor reached the kill point:\n" + "".join(
                lines[-30:])
            if kill_when(lines):
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return True
            time.sleep(0.005)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join()
    assert proc.returncode == 0, "trainer failed:\n" + "".join(lines[-40:])
    return False


def after_update(n, fraction):
    """Kill condition: ``fraction`` of an update after the log line of update ``n``, an update being the
    time between that line and the one of update n - 1 (0 when that one is not logged in this run)."""
    seen = {}

    def condition(lines):
        if "t" not in seen:
            for key, update in (("before", n - 1), ("t", n)):
                if key not in seen and any(f"num_updates={update}," in line for line in lines):
                    seen[key] = time.monotonic()
            if "t" in seen:
                seen["delay"] = fraction * (seen["t"] - seen.get("before", seen["t"]))
        return "t" in seen and time.monotonic() - seen["t"] >= seen["delay"]

    return condition


def assert_loads_if_present(path):
    if os.path.exists(path):
        state = load_state(path)  # a truncated file would raise CheckpointError here
        return num_updates(state)
    return 0


RANDOM_KILLS = 8  # kills at seeded random moments per architecture (and one during a checkpoint copy)
KILL_RESUME_ARCHS = {
    "builtin_transformer": TINY_BUILTIN_TRANSFORMER,
    "vaswani_transformer_tiny": ["--arch", "vaswani_transformer_tiny"],
}


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(KILL_RESUME_ARCHS))
def test_kill_9_and_resume_equals_uninterrupted_run(tmp_path, data_bin, arch):
    arch_args = KILL_RESUME_ARCHS[arch]
    total, every = 12, 3  # 8 updates per epoch: saves mid-epoch and at epoch ends
    # The kills fall in epochs 1 and 2: resumes in epoch 2 need the suite's resume_batches patch
    # (tests/unit/patches/test_resume.py).
    resumable = ["--save-interval-updates", every]
    # Seeded: every run draws the same kill moments (update numbers and delays), so a failure
    # names its moments; what varies is how far the trainer gets within a delay on a loaded machine.
    seed = 20261201
    rng = random.Random(seed)
    context = f"(kill moments drawn with random.Random({seed}))"
    straight, killed = str(tmp_path / "straight"), str(tmp_path / "killed")
    run(train_cmd(data_bin, straight, total, *resumable, arch=arch_args), env=ONE_THREAD)

    args = train_cmd(data_bin, killed, total, *resumable, arch=arch_args)
    last = os.path.join(killed, "checkpoint_last.pt")
    stalled = [sys.executable, "-c", STALL_ON_LAST_CHECKPOINT_COPY] + args[1:]

    def half_written(started):
        return [t for t in glob.glob(last + ".*.tmp") if os.path.getsize(t) > 0 and os.path.getmtime(t) >= started]

    # RANDOM_KILLS seeded moments: each a random fraction of an update after the log line of a random
    # update 2-4 updates past the one the run resumes from (the kill falls in a forward, a backward,
    # an optimizer step, a save, a log line), before the last update (a kill after the final save:
    # test_finished_run.py). The 2nd kill is the one moment timing cannot hit reliably: during the
    # copy onto checkpoint_last.pt (a half-written .tmp file on disk).
    for kill in range(RANDOM_KILLS + 1):
        resumed_from = assert_loads_if_present(last)
        if kill == 1:
            started = time.time()
            assert run_until_killed(stalled, lambda lines: half_written(started)), context
            (tmp,) = half_written(started)
            assert 0 < os.path.getsize(tmp) < os.path.getsize(os.path.join(straight, "checkpoint_last.pt"))
            saved = [num_updates(load_state(os.path.join(killed, name))) for name in os.listdir(killed)
                     if name.endswith(".pt") and name != "checkpoint_last.pt"]
            assert assert_loads_if_present(last) < max(saved), "checkpoint_last.pt should predate the killed save"
            continue
        update, fraction = min(resumed_from + rng.randint(2, 4), total - 2), rng.random()
        assert run_until_killed(args, after_update(update, fraction)), f"{context}: kill {kill} after update {update}"
        assert assert_loads_if_present(last) < total, context
    # Last restart runs to the end.
    assert not run_until_killed(args, lambda lines: False), context

    a, b = load_state(os.path.join(straight, "checkpoint_last.pt")), load_state(last)
    assert num_updates(a) == num_updates(b) == total
    assert_same(a["model"], b["model"], "model")
    assert_same(a["last_optimizer_state"], b["last_optimizer_state"], "optimizer state")
    for key in ("num_updates", "optimizer_name", "criterion_name"):
        assert_same(a["optimizer_history"][-1][key], b["optimizer_history"][-1][key], key)
    # The scheduler's "best" validation loss is the one entry fairseq does not restore exactly: it saves
    # the end-of-epoch checkpoint *before* calling lr_step(epoch, val_loss), so a run resumed from
    # that checkpoint never records that epoch's loss (None here). inverse_sqrt_warmup does not
    # read it; the learning rate it sets is compared bitwise in the optimizer state above.
    a_scheduler, b_scheduler = (dict(s["optimizer_history"][-1]["lr_scheduler_state"]) for s in (a, b))
    assert b_scheduler.pop("best") in (a_scheduler.pop("best"), None)
    assert_same(a_scheduler, b_scheduler, "lr_scheduler_state")
    assert_same(a["extra_state"]["train_iterator"], b["extra_state"]["train_iterator"], "train_iterator")


# ------------------------------------------------------------------ 2. full disk


def limit_file_size(limit):
    def preexec():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


@pytest.fixture(scope="module")
def short_run(tmp_path_factory, data_bin):
    """A save directory after 3 updates of the tiny built-in transformer."""
    save = str(tmp_path_factory.mktemp("short-run"))
    run(train_cmd(data_bin, save, 3, "--save-interval-updates", 3), env=ONE_THREAD)
    return save


@pytest.mark.slow
def test_full_disk_during_training_fails_cleanly_and_keeps_last_checkpoint(tmp_path, data_bin, short_run):
    save = str(tmp_path / "save")
    shutil.copytree(short_run, save)
    last = os.path.join(save, "checkpoint_last.pt")
    before = sha256(last)
    output = run_failing(train_cmd(data_bin, save, 6, "--save-interval-updates", 3),
                         preexec_fn=limit_file_size(os.path.getsize(last) // 2))
    assert "Traceback" not in output
    assert re.fullmatch(rf"error: {re.escape(save)}/checkpoint_1_6\.pt: checkpoint not saved: File too large "
                        r"\(EFBIG\); .*intact.*", last_line(output)), last_line(output)
    assert sha256(last) == before and num_updates(load_state(last)) == 3
    assert not [name for name in os.listdir(save) if name.endswith(".tmp")]


@pytest.mark.slow
def test_averaging_onto_full_disk_fails_cleanly(tmp_path, short_run):
    output = str(tmp_path / "avg.pt")
    torch.save({"old": torch.zeros(3)}, output)
    before = sha256(output)
    out = run_failing(["fairseq-plugins-average", "--inputs", os.path.join(short_run, "checkpoint_last.pt"),
                       os.path.join(short_run, "checkpoint_1_3.pt"), "--output", output],
                      preexec_fn=limit_file_size(os.path.getsize(os.path.join(short_run, "checkpoint_last.pt")) // 4))
    assert last_line(out).startswith(
        f"fairseq-plugins-average: error: {output}: checkpoint not saved: File too large (EFBIG);")
    assert sha256(output) == before and sorted(os.listdir(tmp_path)) == ["avg.pt"]


# ------------------------------------------------------------------ 3. corrupt and hostile checkpoints


class RunsCode:
    """Unpickling this calls os.system: a checkpoint loader must never do it."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture(scope="module")
def bad_checkpoints(tmp_path_factory, data_bin, short_run):
    root = tmp_path_factory.mktemp("bad-checkpoints")
    marker = str(root / "CODE_WAS_RUN")
    good = os.path.join(short_run, "checkpoint_last.pt")
    with open(good, "rb") as f:
        data = f.read()
    files = {"truncated": data[: len(data) // 2], "text": b"model = transformer\nthis is not a checkpoint\n"}
    for name, content in files.items():
        (root / f"{name}.pt").write_bytes(content)
    torch.save({"model": RunsCode(marker)}, root / "hostile_zip.pt")
    torch.save({"model": RunsCode(marker)}, root / "hostile_legacy.pt", _use_new_zipfile_serialization=False)
    good_state = load_state(good)
    torch.save(good_state["model"], root / "state_dict.pt")  # what model.state_dict() gives
    torch.save({"model": good_state["model"], "cfg": OmegaConf.to_container(good_state["cfg"])},
               root / "stripped.pt")  # its weights and configuration only
    other = str(root / "other")
    run(["fairseq-train", data_bin, "--user-dir", USER_DIR, "--arch", "lstm", "--encoder-embed-dim", "16",
         "--encoder-hidden-size", "16", "--decoder-embed-dim", "16", "--decoder-hidden-size", "16",
         "--decoder-out-embed-dim", "16", "--optimizer", "adam", "--lr", "0.001", "--max-tokens", "500",
         "--max-update", "1", "--save-dir", other, "--cpu", "--disable-validation", "--no-epoch-checkpoints",
         "--num-workers", "0"], env=ONE_THREAD)
    return {"good": good, "marker": marker, "other_arch": os.path.join(other, "checkpoint_last.pt"),
            **{name: str(root / f"{name}.pt") for name in ["truncated", "text", "hostile_zip", "hostile_legacy",
                                                           "state_dict", "stripped"]}}


REFUSALS = {
    "truncated": r"not a readable checkpoint, truncated or not a torch file",
    "text": r"not a readable checkpoint, truncated or not a torch file",
    "hostile_zip": r"refused to load: it needs posix\.system.*could run code",
    "hostile_legacy": r"refused to load: it needs posix\.system.*could run code",
    # torch files, not fairseq checkpoints: fairseq itself ends in a KeyError's traceback
    "state_dict": r"not a fairseq checkpoint \(no 'model' entry\)",
    "stripped": r"not a complete fairseq checkpoint \(fairseq's loader found no 'best_loss' entry\)",
}


def assert_refused(output, path, reason, prefix="error: "):
    assert "Traceback" not in output, output[-3000:]
    assert re.fullmatch(rf"{prefix}{re.escape(path)}: {reason}.*", last_line(output)), last_line(output)


CONVERTER_PREFIX = "fairseq-plugins-convert-transformer: error: "
AVERAGE_PREFIX = "fairseq-plugins-average: error: "  # the suite's tools name themselves (fairseq's print "error: ")


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(REFUSALS))
def test_generate_average_convert_refuse_bad_checkpoints_without_running_code(kind, bad_checkpoints, data_bin,
                                                                              tmp_path):
    path, output = bad_checkpoints[kind], str(tmp_path / "out.pt")
    out = run_failing(["fairseq-generate", data_bin, "--user-dir", USER_DIR, "--path", path, "--gen-subset", "valid",
                       "--max-tokens", "1000", "--cpu"])
    assert_refused(out, path, REFUSALS[kind])
    out = run_failing(["fairseq-plugins-average", "--inputs", bad_checkpoints["good"], path, "--output", output])
    assert_refused(out, path, REFUSALS[kind], prefix=AVERAGE_PREFIX)
    out = run_failing(["fairseq-plugins-convert-transformer", path, output])
    assert_refused(out, path, REFUSALS[kind], prefix=CONVERTER_PREFIX)
    assert not os.path.exists(output)
    assert not os.path.exists(bad_checkpoints["marker"])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["hostile_zip", "hostile_legacy", "truncated", "stripped"])
def test_train_refuses_to_resume_from_a_bad_checkpoint_last_and_changes_nothing(kind, bad_checkpoints, data_bin,
                                                                                tmp_path):
    """fairseq-train (its main, in this process) resuming from a checkpoint_last.pt that would run code
    or is cut short: the suite's one-line error naming the file (a PluginError: the excepthook prints
    its message alone), no code run, and every file of the save directory as it was."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli import train

    save = tmp_path / "save"
    save.mkdir()
    last = save / "checkpoint_last.pt"
    shutil.copy(bad_checkpoints[kind], last)
    shutil.copy(bad_checkpoints["good"], save / "checkpoint_1_3.pt")
    before = {p.name: sha256(p) for p in save.iterdir()}
    args = options.parse_args_and_arch(options.get_training_parser(), train_cmd(data_bin, str(save), 6)[1:])
    with pytest.raises(CheckpointError) as refused:
        train.main(convert_namespace_to_omegaconf(args))
    message = str(refused.value)
    assert "\n" not in message and re.fullmatch(rf"{re.escape(str(last))}: {REFUSALS[kind]}.*", message), message
    assert not os.path.exists(bad_checkpoints["marker"])
    assert {p.name: sha256(p) for p in save.iterdir()} == before


@pytest.mark.slow
def test_average_and_convert_refuse_checkpoints_of_another_architecture(bad_checkpoints, tmp_path):
    output, other = str(tmp_path / "out.pt"), bad_checkpoints["other_arch"]
    out = run_failing(["fairseq-plugins-average", "--inputs", bad_checkpoints["good"], other, "--output", output])
    assert_refused(out, other, r"parameters differ from .*: different architectures", prefix=AVERAGE_PREFIX)
    out = run_failing(["fairseq-plugins-convert-transformer", other, output])
    assert_refused(out, other, r".*\blstm\b", prefix=CONVERTER_PREFIX)
    assert not os.path.exists(output)


# ------------------------------------------------------------------ 4. bad corpora


def write_pairs(directory, name, src_lines, tgt_lines, src_newline=b"\n"):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"{name}.src"), "wb") as f:
        f.write(b"".join(line + src_newline for line in src_lines))
    with open(os.path.join(directory, f"{name}.tgt"), "wb") as f:
        f.write(b"".join(line + b"\n" for line in tgt_lines))


def read_pairs(corpus_dir, split="train", n=40):
    lines = {}
    for side in ("src", "tgt"):
        with open(os.path.join(corpus_dir, f"{split}.{side}"), "rb") as f:
            lines[side] = f.read().splitlines()[:n]
    return lines["src"], lines["tgt"]


def binarized_lengths(data, split="train"):
    from fairseq.data import Dictionary, data_utils

    dictionary = Dictionary.load(os.path.join(data, "dict.src.txt"))
    return {side: [len(s) for s in data_utils.load_indexed_dataset(os.path.join(data, f"{split}.src-tgt.{side}"),
                                                                    dictionary)]
            for side in ("src", "tgt")}


def preprocess_train(raw, dest, data_bin):
    return run(["fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", f"{raw}/train",
                "--destdir", dest, "--workers", "1", "--srcdict", os.path.join(data_bin, "dict.src.txt"),
                "--tgtdict", os.path.join(data_bin, "dict.tgt.txt")])


@pytest.mark.slow
def test_mismatched_line_counts_are_an_error_never_a_shifted_alignment(tmp_path, corpus_dir, data_bin):
    src, tgt = read_pairs(corpus_dir)
    raw, dest = str(tmp_path / "raw"), str(tmp_path / "bin")
    write_pairs(raw, "train", src, tgt[:-1])
    # fairseq-preprocess binarizes the two sides independently and accepts them...
    preprocess_train(raw, dest, data_bin)
    for split in ("valid", "test"):
        for suffix in ("src", "tgt"):
            shutil.copy(os.path.join(data_bin, f"{split}.src-tgt.{suffix}.bin"), dest)
            shutil.copy(os.path.join(data_bin, f"{split}.src-tgt.{suffix}.idx"), dest)
    # ...and fairseq-train refuses them when it loads the split (an assertion, with a traceback).
    out = run_failing(train_cmd(dest, str(tmp_path / "save"), 1))
    assert "AssertionError: Source and target must contain the same number of examples" in out
    # The suite's cleaning step names both files and both counts, before anything is binarized.
    out = run_failing(["fairseq-plugins-tokenize", "clean", "--src", f"{raw}/train.src", "--tgt", f"{raw}/train.tgt",
                       "--src-out", str(tmp_path / "c.src"), "--tgt-out", str(tmp_path / "c.tgt"),
                       "--min-len", "1", "--max-len", "100"])
    assert last_line(out) == (f"fairseq-plugins-tokenize: error: clean: line counts differ: {raw}/train.src has "
                              f"{len(src)} lines, "
                              f"{raw}/train.tgt has {len(src) - 1} lines")
    assert not os.path.exists(tmp_path / "c.src") and not os.path.exists(tmp_path / "c.tgt")


@pytest.mark.slow
def test_dirty_lines_shift_fairseq_preprocess_but_not_the_cleaned_corpus(tmp_path, corpus_dir, data_bin):
    """Lone CR, CRLF, invalid UTF-8 and empty lines, raw and through ``fairseq-plugins-tokenize clean``."""
    src, tgt = read_pairs(corpus_dir)
    dirty = list(src)
    dirty[5] = dirty[5].replace(b" ", b"\r", 1)  # a lone CR inside a line: Python's text mode splits there
    dirty[7] = dirty[7] + b" \xff\xfe"  # invalid UTF-8
    dirty[3], tgt_dirty = b"", tgt[:3] + [b""] + tgt[4:]  # an empty pair
    raw = str(tmp_path / "raw")

    # Raw fairseq-preprocess: a lone CR silently splits a source line, one sentence more than the target.
    write_pairs(raw, "train", dirty[:7] + dirty[8:], tgt_dirty[:7] + tgt_dirty[8:], src_newline=b"\r\n")
    preprocess_train(raw, str(tmp_path / "bin-cr"), data_bin)
    lengths = binarized_lengths(str(tmp_path / "bin-cr"))
    assert len(lengths["src"]) == len(lengths["tgt"]) + 1

    # The suite's clean step keeps the sides aligned and counts every repair and drop.
    write_pairs(raw, "train", dirty, tgt_dirty, src_newline=b"\r\n")
    clean = str(tmp_path / "clean")
    os.makedirs(clean)
    out = run(["fairseq-plugins-tokenize", "clean", "--src", f"{raw}/train.src", "--tgt", f"{raw}/train.tgt",
               "--src-out", f"{clean}/train.src", "--tgt-out", f"{clean}/train.tgt", "--min-len", "1",
               "--max-len", "100"])
    assert f"{raw}/train.src: {len(src)} lines; {len(src)} CRLF endings removed" in out
    assert re.search(rf"kept {len(src) - 2} of {len(src)} pairs; dropped 1 outside length .*, 1 with invalid UTF-8",
                     out), out
    kept_src, kept_tgt = read_pairs(clean, n=len(src))
    expected = [(s.replace(b"\r", b" "), t) for i, (s, t) in enumerate(zip(dirty, tgt_dirty)) if i not in (3, 7)]
    assert list(zip(kept_src, kept_tgt)) == expected


@pytest.mark.slow
def test_ten_thousand_token_line_is_refused_or_skipped_and_counted(tmp_path, corpus_dir, data_bin):
    src, tgt = read_pairs(corpus_dir)
    words = b" ".join(src).split()
    long_line = b" ".join(random.Random(0).choice(words) for _ in range(10000))
    raw, dest = str(tmp_path / "raw"), str(tmp_path / "bin")
    for split in ("train", "valid"):
        write_pairs(raw, split, src[:9] + [long_line] + src[10:], tgt[:9] + [long_line] + tgt[10:])
    run(["fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", f"{raw}/train",
         "--validpref", f"{raw}/valid", "--destdir", dest, "--workers", "1", "--srcdict",
         os.path.join(data_bin, "dict.src.txt"), "--tgtdict", os.path.join(data_bin, "dict.tgt.txt")])
    assert binarized_lengths(dest, "valid")["src"][9] == 10001  # kept by fairseq-preprocess (tokens + </s>)
    # Training data: always skipped and counted (max_positions: 1024 positions, capped by --max-tokens 500).
    out = run_failing(train_cmd(dest, str(tmp_path / "save"), 1))
    # fairseq's log prefix is "WARNING:name:" or "... | WARNING | name | " depending on who configured logging first
    assert re.search(r"WARNING(:| \| )fairseq.tasks.fairseq_task(:| \| )1 samples have invalid sizes and will be skipped, "
                     r"max_positions=\(500, 500\), first few sample ids=\[9\]", out), out[-3000:]
    # Validation data: refused, naming the sample and the flag that turns it into the same counted skip.
    assert re.search(r"Size of sample #9 is invalid \(=\((np.int32\()?10001\)?, (np.int32\()?10001\)?\)\) since "
                     r"max_positions=\(1024, 1024\), skip this example with --skip-invalid-size-inputs-valid-test",
                     last_line(out)), out[-3000:]


@pytest.mark.slow
def test_missing_split_names_the_split(tmp_path, data_bin):
    dest = str(tmp_path / "bin")
    shutil.copytree(data_bin, dest)
    for name in os.listdir(dest):
        if name.startswith("valid."):
            os.remove(os.path.join(dest, name))
    out = run_failing(train_cmd(dest, str(tmp_path / "save"), 1))
    assert re.search(rf"FileNotFoundError: Dataset not found: valid \({re.escape(dest)}\)", out), out[-3000:]


# ------------------------------------------------------------------ 5. numerical faults


NAN_TRAINING = ["--criterion", "label_smoothed_xent", "--label-smoothing", "0.1", "--optimizer", "adam",
                "--max-tokens", "500", "--cpu", "--seed", "1", "--no-progress-bar", "--log-interval", "1",
                "--num-workers", "0", "--disable-validation"]
# name: (architecture and extra flags, batches per update)
NAN_RUNS = {
    "builtin_transformer": (TINY_BUILTIN_TRANSFORMER, 1),
    "vaswani_transformer_tiny": (["--arch", "vaswani_transformer_tiny"], 1),
    "rnnsearch_tiny": (["--arch", "rnnsearch_tiny"], 1),
    "vaswani_transformer_tiny_update_freq_2": (["--arch", "vaswani_transformer_tiny", "--update-freq", "2"], 2),
    "vaswani_transformer_tiny_autocast_bf16": (["--arch", "vaswani_transformer_tiny", "--autocast-bf16"], 1),
}


def first_non_finite_module_of(checkpoint, data_bin, ids, autocast_bf16):
    """Where a forward pass of ``checkpoint``'s model on the sentences ``ids`` first holds NaN/Inf."""
    from fairseq import checkpoint_utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides={"data": data_bin})
    task.load_dataset("train")
    dataset = task.dataset("train")
    sample = dataset.collater([dataset[i] for i in ids])
    return first_non_finite_module(models[0].eval(), sample["net_input"],
                                   torch.bfloat16 if autocast_bf16 else None)


def nan_train_cmd(data, save_dir, arch_and_flags, *extra):
    return ["fairseq-train", data, "--user-dir", USER_DIR, *arch_and_flags, *NAN_TRAINING, "--save-dir", save_dir,
            *extra]


def reported_ids(line):
    """The sentence ids a NaN/Inf report names, checked against the count it gives."""
    match = re.search(r"sentence ids of 'train': \[([\d, ]+)\] \((\d+) sentences in (\d+) batch(es)?\)", line)
    assert match, line
    ids = [int(i) for i in match.group(1).split(", ")]
    assert len(ids) == int(match.group(2)) == len(set(ids)) and ids == sorted(ids), line
    return ids, int(match.group(3))


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(name, marks=needs_native_bf16) if "--autocast-bf16" in NAN_RUNS[name][0]
                                  else name for name in sorted(NAN_RUNS)])
def test_nan_gradients_stop_training_with_the_batch_named_and_the_last_checkpoint_kept(tmp_path, data_bin, name):
    """fp32 (or --autocast-bf16) on CPU: lr 1e30 makes update 1 finite but huge and update 2's gradients NaN/Inf.

    fairseq raises FloatingPointError before the optimizer step, saves crash.pt and re-runs the
    update under its NanDetector; the suite turns that into one line naming the update, the
    sentences of every batch of it, the first module whose output was non-finite, and the files.
    """
    arch_and_flags, batches = NAN_RUNS[name]
    save = str(tmp_path / "save")
    out = run_failing(nan_train_cmd(data_bin, save, arch_and_flags, "--lr", "1e30", "--max-update", "5",
                                    "--save-interval-updates", "1"))
    assert "Traceback" not in out, out[-3000:]
    line = last_line(out)
    assert re.fullmatch(
        r"error: update 2: gradients are Nan/Inf; sentence ids of 'train': \[[\d, ]+\] \(\d+ sentences in "
        rf"{batches} batch(es)?\); first non-finite value: (NaN|Inf) in the forward output of ([\w.]+) "
        rf"\(shape [\dx]+\); this update was not applied: {re.escape(save)}/crash\.pt holds the state before it, "
        rf"{re.escape(save)}/checkpoint_last\.pt \(update 1\) is unchanged", line), line
    ids, _ = reported_ids(line)
    assert 0 <= ids[0] and ids[-1] < 300 and len(ids) < 150  # one update of --max-tokens 500 (x2), not the corpus
    # the state before the failed update, run forward on the named sentences with plain hooks
    module = re.search(r"in the forward output of ([\w.]+) ", line).group(1)
    assert module == first_non_finite_module_of(os.path.join(save, "crash.pt"), data_bin, ids,
                                                "--autocast-bf16" in arch_and_flags), line
    state = load_state(os.path.join(save, "checkpoint_last.pt"))
    assert num_updates(state) == 1
    assert all(torch.isfinite(p).all() for p in state["model"].values())
    assert max(p.abs().max() for p in state["model"].values()) > 1e20  # update 1 did apply lr 1e30
    crash = load_state(os.path.join(save, "crash.pt"))
    assert_same(crash["model"], state["model"], "crash.pt model")  # the state before the failed step


@pytest.mark.slow
def test_nan_report_names_the_sentence_that_caused_it(tmp_path, corpus_dir, data_bin):
    """One word of one training line gets an embedding of 1e38 (finite; times sqrt(dim) it is Inf).

    Training starts from that model: the update whose batch holds that line fails, and the
    report must name that line's id (ids are 0-based line numbers of the train split).
    """
    from fairseq.data import Dictionary

    with open(os.path.join(corpus_dir, "train.src")) as f:
        lines = f.read().splitlines()
    counts = Counter(word for line in lines for word in set(line.split()))
    word = sorted(w for w, n in counts.items() if n == 1)[0]
    poisoned_line = next(i for i, line in enumerate(lines) if word in line.split())
    start = str(tmp_path / "start")
    run(nan_train_cmd(data_bin, start, TINY_BUILTIN_TRANSFORMER, "--lr", "0.002", "--max-update", "1"),
        env=ONE_THREAD)
    state = load_state(os.path.join(start, "checkpoint_last.pt"))
    # the built-in transformer's source embeddings are used for source tokens only (not tied)
    index = Dictionary.load(os.path.join(data_bin, "dict.src.txt")).index(word)
    state["model"]["encoder.embed_tokens.weight"][index] = 1e38
    save_state(state, str(tmp_path / "poisoned.pt"))

    save = str(tmp_path / "save")
    out = run_failing(nan_train_cmd(data_bin, save, TINY_BUILTIN_TRANSFORMER, "--lr", "0.002", "--max-update", "20",
                                    "--finetune-from-model", tmp_path / "poisoned.pt"))
    assert "Traceback" not in out, out[-3000:]
    line = last_line(out)
    ids, batches = reported_ids(line)
    assert poisoned_line in ids and batches == 1, (poisoned_line, line)
    assert len(ids) < 100, line
    # the scaled embedding is Inf; the first module output holding NaN is the dropout after it (Inf * 0)
    assert "; first non-finite value: NaN in the forward output of encoder.dropout_module (shape " in line, line
    assert ", whose input already held Inf;" in line, line
    assert "NaN/Inf before this update" not in line  # the parameters were finite: the sentence's word did it
    assert line.endswith(f"this update was not applied: {save}/crash.pt holds the state before it, "
                         "no checkpoint_last.pt had been saved"), line


@pytest.mark.slow
def test_optimizer_step_that_overflows_is_never_saved(tmp_path, data_bin):
    """Update 1 at lr 1e-3, update 2 at lr 5e38 (warmup to 1e39): its step makes parameters Inf.

    Without the suite, fairseq writes those Inf parameters to checkpoint_last.pt and the next
    update fails; with it, the save is refused and checkpoint_last.pt keeps update 1.
    """
    save = str(tmp_path / "save")
    out = run_failing(nan_train_cmd(data_bin, save, TINY_BUILTIN_TRANSFORMER, "--lr", "1e39", "--lr-scheduler",
                                    "inverse_sqrt", "--warmup-init-lr", "1e-3", "--warmup-updates", "2",
                                    "--max-update", "5", "--save-interval-updates", "1"))
    assert "Traceback" not in out, out[-3000:]
    assert re.fullmatch(
        r"error: update 2: the parameters hold NaN/Inf after its optimizer step \(\d+ of \d+ parameters, the first "
        rf"Inf in encoder\.embed_tokens\.weight\); {re.escape(save)}/checkpoint_1_2\.pt was not written and "
        rf"{re.escape(save)}/checkpoint_last\.pt \(update 1\) is unchanged; lower --lr", last_line(out)), last_line(out)
    assert sorted(os.listdir(save)) == ["checkpoint_1_1.pt", "checkpoint_last.pt"]
    state = load_state(os.path.join(save, "checkpoint_last.pt"))
    assert num_updates(state) == 1 and all(torch.isfinite(p).all() for p in state["model"].values())
