"""The foundation through fairseq's own CLIs: preprocess, train, resume, generate, average, score.

fairseq's built-in ``transformer`` is trained here with the suite's criterion and scheduler,
so these tests do not depend on any model family of the suite.
"""
import json
import math
import os
import re
import shutil
import zipfile

import pytest
import torch
from sacrebleu.metrics import BLEU

from fairseq_plugins.checkpoints import load_state
from fairseq_plugins.cli import average_checkpoints
from helpers import TINY_BUILTIN_TRANSFORMER, USER_DIR, run, train

pytestmark = pytest.mark.slow

WARMUP, PEAK = 4, 0.002  # --lr of helpers.train
SUITE_TRAINING = [*TINY_BUILTIN_TRANSFORMER, "--share-all-embeddings", "--criterion", "label_smoothed_xent",
                  "--label-smoothing", "0.1", "--lr-scheduler", "inverse_sqrt_warmup", "--warmup-updates", str(WARMUP),
                  "--save-interval-updates", "2", "--log-format", "json", "--max-tokens", "400"]


def logged_updates(log):
    """(num_updates, lr) of every json train_inner line."""
    rows = []
    for line in log.splitlines():
        if "| train_inner |" in line:
            record = json.loads(line.split("| train_inner |", 1)[1])
            rows.append((int(record["num_updates"]), float(record["lr"])))
    return rows


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, data_bin):
    save = str(tmp_path_factory.mktemp("ckpt"))
    log = train(data_bin, save, SUITE_TRAINING, max_update=5)
    return data_bin, save, log


def test_train_logs_scheduler_and_criterion(run_dir):
    _, save, log = run_dir
    rows = logged_updates(log)
    assert [n for n, _ in rows] == [1, 2, 3, 4, 5]
    for num_updates, lr in rows:
        t = num_updates + 1  # the rate logged after update n is the one for update n + 1
        assert lr == pytest.approx(PEAK * min(t / WARMUP, math.sqrt(WARMUP / t)), rel=1e-3)
    assert "nll_loss" in log and "ppl" in log
    assert {"checkpoint_last.pt", "checkpoint_1_2.pt", "checkpoint_1_4.pt"} <= set(os.listdir(save))


def test_resume_continues_update_count(run_dir, tmp_path):
    data, save, _ = run_dir
    resumed = str(tmp_path / "resumed")
    shutil.copytree(save, resumed)
    log = train(data, resumed, SUITE_TRAINING, max_update=7)
    assert "@ 5 updates" in log  # fairseq's "loaded checkpoint ... (epoch E @ 5 updates)"
    rows = logged_updates(log)
    assert [n for n, _ in rows] == [6, 7]
    assert rows[-1][1] == pytest.approx(PEAK * math.sqrt(WARMUP / 8), rel=1e-3)
    assert load_state(os.path.join(resumed, "checkpoint_last.pt"))["optimizer_history"][-1]["num_updates"] == 7


def test_generate_and_score(run_dir, tmp_path):
    data, save, _ = run_dir
    out = run(["fairseq-generate", data, "--user-dir", USER_DIR, "--path", f"{save}/checkpoint_last.pt",
               "--beam", "4", "--batch-size", "16", "--cpu", "--gen-subset", "test"])
    hyps = [line for line in out.splitlines() if line.startswith("H-")]
    assert len(hyps) == 30
    gen = tmp_path / "gen.txt"
    gen.write_text(out)
    score = run(["fairseq-plugins-score", "--gen", gen, "--out", tmp_path / "score"])
    # the oracle: sacrebleu itself on the D- hypotheses and T- references, in sentence order
    fields = {kind: dict(sorted((int(key[2:]), rest.split("\t")[-1]) for key, _, rest in
                                (line.partition("\t") for line in out.splitlines()) if key[:2] == f"{kind}-"))
              for kind in "DT"}
    assert len(fields["D"]) == len(fields["T"]) == 30
    bleu = BLEU()
    expected = bleu.corpus_score(list(fields["D"].values()), [list(fields["T"].values())])
    assert f"{expected.format(signature=str(bleu.get_signature()))}" in score, score  # value and signature
    assert re.search(rf"^\| gen \| 30 \| {expected.score:.2f} \|", (tmp_path / "score.md").read_text(), re.M), (
        (tmp_path / "score.md").read_text())


@pytest.fixture(scope="module")
def avg(run_dir, tmp_path_factory):
    """fairseq-plugins-average of the last 2 interval checkpoints of ``run_dir`` (checkpoint_1_2, _1_4)."""
    _, save, _ = run_dir
    avg = str(tmp_path_factory.mktemp("average") / "avg.pt")
    run(["fairseq-plugins-average", "--inputs", save, "--num-update-checkpoints", "2", "--output", avg])
    return avg


def test_average_is_the_mean_and_generates(run_dir, avg):
    data, save, _ = run_dir
    a = load_state(f"{save}/checkpoint_1_2.pt")["model"]
    b = load_state(f"{save}/checkpoint_1_4.pt")["model"]
    averaged = load_state(avg)["model"]
    assert set(averaged) == set(a)
    for name in a:
        torch.testing.assert_close(averaged[name], (a[name].double() + b[name].double()).div(2).to(a[name].dtype))
    assert not torch.equal(a["encoder.layers.0.fc1.weight"], b["encoder.layers.0.fc1.weight"])
    out = run(["fairseq-generate", data, "--user-dir", USER_DIR, "--path", avg, "--beam", "2", "--cpu",
               "--batch-size", "16", "--gen-subset", "valid"])
    assert sum(line.startswith("H-") for line in out.splitlines()) == 30


def stored_tensors(path):
    """The tensor storages in a torch zip file (a tied weight is stored once)."""
    with zipfile.ZipFile(path) as f:
        return sum(re.search(r"/data/\d+$", name) is not None for name in f.namelist())


def storages(obj):
    """The distinct storages of the tensors anywhere in ``obj``."""
    if torch.is_tensor(obj):
        return {obj.untyped_storage().data_ptr()}
    values = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else []
    return set().union(*map(storages, values))


def test_average_keeps_tied_weights_tied(run_dir, avg):
    """--share-all-embeddings: encoder and decoder embeddings and the output projection are one
    tensor; the average must store it once too (it used to store 35 tensors for the input's 33)."""
    _, save, _ = run_dir
    checkpoint = f"{save}/checkpoint_1_4.pt"
    averaged = load_state(avg)["model"]
    tied = ["encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "decoder.output_projection.weight"]
    assert len({averaged[name].untyped_storage().data_ptr() for name in tied}) == 1
    stored_model = len(storages(load_state(checkpoint)["model"]))
    assert len(storages(averaged)) == stored_model < len(averaged)
    # in the file: the model's tensors plus the few of extra_state (the optimizer state is dropped)
    others = {k: v for k, v in load_state(avg).items() if k != "model"}
    assert stored_tensors(avg) == stored_model + len(storages(others))


def average_fails(args, output):
    proc = run(["fairseq-plugins-average", *args, "--output", output], check=False)
    assert proc.returncode == 2, proc.stdout
    lines = [line for line in proc.stdout.splitlines() if line.startswith("fairseq-plugins-average: error:")]
    assert len(lines) == 1, proc.stdout
    return lines[0]


def test_average_refuses_bad_inputs_and_keeps_output(run_dir, tmp_path):
    _, save, _ = run_dir
    output = tmp_path / "avg.pt"
    output.write_bytes(b"previous average")
    assert "found 2" in average_fails(["--inputs", save, "--num-update-checkpoints", "3"], output)

    not_ckpt = tmp_path / "notes.pt"
    not_ckpt.write_text("hello\n")
    assert str(not_ckpt) in average_fails(["--inputs", f"{save}/checkpoint_1_2.pt", str(not_ckpt)], output)

    state = torch.load(f"{save}/checkpoint_1_2.pt", weights_only=False)
    state["model"]["encoder.layers.0.fc1.weight"] = torch.zeros(8, 32)
    other = tmp_path / "other_arch.pt"
    torch.save(state, other)
    message = average_fails(["--inputs", f"{save}/checkpoint_1_2.pt", str(other)], output)
    assert str(other) in message and "encoder.layers.0.fc1.weight" in message
    assert output.read_bytes() == b"previous average"



def numbered_checkpoint(path, value):
    """A minimal fairseq checkpoint whose one parameter is ``value``: an average tells which files it took."""
    torch.save({"model": {"w": torch.full((3,), float(value))}, "args": None, "cfg": None,
                "optimizer_history": [{"criterion_name": "x", "optimizer_name": "y", "lr_scheduler_state": {},
                                       "num_updates": int(value)}], "extra_state": {"train_iterator": None}}, path)


@pytest.mark.parametrize("flags, taken", [
    (["--num-epoch-checkpoints", "2"], [8, 10]),  # by number: 10 after 8 after 2 (not by name: "10" < "2")
    (["--num-epoch-checkpoints", "3"], [2, 8, 10]),
    (["--num-epoch-checkpoints", "2", "--checkpoint-upper-bound", "8"], [2, 8]),
    (["--num-update-checkpoints", "2"], [80, 100]),
    (["--num-update-checkpoints", "2", "--checkpoint-upper-bound", "80"], [20, 80]),
    (["--num-update-checkpoints", "1", "--checkpoint-upper-bound", "99"], [80]),
], ids=["epochs-last-2", "epochs-all-3", "epochs-upper-bound", "updates-last-2", "updates-upper-bound",
        "updates-bound-between"])
def test_average_takes_the_last_n_by_number_up_to_the_bound(tmp_path, capsys, flags, taken):
    """fairseq-plugins-average --inputs DIR picks the newest N of one kind by their number, never
    checkpoint_last/best or the other kind, and averages exactly those (each file's parameter is its number)."""
    for n in (2, 8, 10):
        numbered_checkpoint(tmp_path / f"checkpoint{n}.pt", n)
    for epoch, n in ((1, 20), (2, 80), (3, 100)):
        numbered_checkpoint(tmp_path / f"checkpoint_{epoch}_{n}.pt", n)
    for name in ("checkpoint_last.pt", "checkpoint_best.pt"):
        numbered_checkpoint(tmp_path / name, 1000)
    output = tmp_path / "out" / "avg.pt"
    output.parent.mkdir()
    average_checkpoints.main(["--inputs", str(tmp_path), *flags, "--output", str(output)])  # the command's main
    listed = re.search(r"averaging (\d+) checkpoints: (.*)", capsys.readouterr().out)
    names = [os.path.basename(p) for p in listed.group(2).split(", ")]
    assert int(listed.group(1)) == len(names) == len(taken)
    assert [int(re.findall(r"\d+", name)[-1]) for name in names] == taken
    assert load_state(str(output))["model"]["w"].tolist() == pytest.approx([sum(taken) / len(taken)] * 3, rel=1e-7)


@pytest.mark.parametrize("flags, found", [(["--num-epoch-checkpoints", "4"], "found 3"),
                                          (["--num-update-checkpoints", "3", "--checkpoint-upper-bound", "80"],
                                           "found 2")])
def test_average_refuses_a_folder_with_fewer_than_n(tmp_path, capsys, flags, found):
    for n in (2, 8, 10):
        numbered_checkpoint(tmp_path / f"checkpoint{n}.pt", n)
    for epoch, n in ((1, 20), (2, 80), (3, 100)):
        numbered_checkpoint(tmp_path / f"checkpoint_{epoch}_{n}.pt", n)
    output = tmp_path / "avg.pt"
    output.write_bytes(b"previous average")
    with pytest.raises(SystemExit) as exit_:
        average_checkpoints.main(["--inputs", str(tmp_path), *flags, "--output", str(output)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"fairseq-plugins-average: error: {tmp_path}: asked for the last ") and found in err, err
    assert output.read_bytes() == b"previous average"

class RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_hostile_checkpoint_is_refused(run_dir, tmp_path):
    data, save, _ = run_dir
    marker = tmp_path / "code-ran"
    state = torch.load(f"{save}/checkpoint_1_2.pt", weights_only=False)
    state["extra_state"]["payload"] = RunsCode(marker)
    evil = tmp_path / "evil.pt"
    torch.save(state, evil)
    proc = run(["fairseq-generate", data, "--user-dir", USER_DIR, "--path", evil, "--cpu"], check=False)
    assert proc.returncode != 0
    assert f"error: {evil}: refused to load" in proc.stdout and "Traceback" not in proc.stdout
    assert "refused to load" in average_fails(["--inputs", str(evil), f"{save}/checkpoint_1_2.pt"], tmp_path / "a.pt")
    assert not marker.exists()
