"""README command #1 on a tiny budget: it runs end to end (two trainings at a time), prints its
table and BLEU by source length, skips done steps, says when a model stopped on its time limit,
and averages only the end of the training done."""
import importlib.util
import os
import re
import sys

import pytest
import sacrebleu

from fairseq_plugins.analysis.generate_output import read_generate
from fairseq_plugins.checkpoints import averaging_window
from helpers import REPO, run


def table_row(out, model):
    rows = [line for line in out.splitlines() if line.startswith(f"| {model} |")]
    assert len(rows) == 1
    return rows[0], [cell.strip() for cell in rows[0].strip("|").split("|")]


def length_line(out, model):
    lines = [line.split() for line in out.split("BLEU by source length")[1].splitlines() if line.split()[:1] == [model]]
    assert len(lines) == 1
    return [None if cell == "-" else float(cell) for cell in lines[0][1:]]


@pytest.mark.slow
def test_quickstart_runs_resumes_and_reports_a_time_limit(tmp_path):
    cmd = [sys.executable, f"{REPO}/scripts/quickstart.py", "--work", tmp_path, "--train", "300", "--test", "20",
           "--max-len", "10"]
    models = ["rnnencdec_tiny", "seq2seq_lstm_tiny"]
    out = run([*cmd, "--models", *models, "--max-update", "3", "--jobs", "2", "--progress-seconds", "0.2"])
    # progress is one line of every model's updates of its budget; fairseq's own lines stay in the logs
    assert "fairseq-train" in out and "train_inner" not in out
    progress = [line.split("] ", 1)[1] for line in out.splitlines() if "training, updates done" in line]
    assert progress and all(re.fullmatch(r"training, updates done: rnnencdec_tiny [0-3]/3, seq2seq_lstm_tiny [0-3]/3",
                                         line) for line in progress), progress
    for model in models:
        row, (_, params, updates, minutes, bleu, chrf) = table_row(out, model)
        assert int(params.replace(",", "")) > 1000 and updates == "3"
        assert 0 <= float(bleu) <= 100 and 0 <= float(chrf) <= 100
        # BLEU by source length, checked against sacrebleu on the sentences grouped here by word count
        gens = read_generate(os.path.join(tmp_path, model, "generate.txt"))
        expected = []
        for low, high in ((5, 6), (7, 8), (9, 10)):  # thirds of 5-10 words, as the header says
            group = [g for g in gens if low <= len(g.src.split()) <= high]
            expected.append(round(sacrebleu.corpus_bleu([g.output for g in group], [[g.ref for g in group]]).score, 1)
                            if group else None)
        assert length_line(out, model) == expected
    assert "BLEU by source length (words): 5-6, 7-8, 9-10" in out
    assert "(test set: 20 sentences" in out and "time limit" not in out and "examples/paper_claims" in out
    again = run([*cmd, "--models", *models, "--max-update", "3"])
    assert again.count("done before, skipping") == 2 and "fairseq-train" not in again.split("done before")[0]
    assert row in again
    # A limit of 0.03 s: fairseq-train stops after its first update, and the output says so.
    out = run([*cmd, "--work", tmp_path / "limit", "--models", "rnnsearch_tiny", "--max-update", "300",
               "--minutes", "0.0005"])
    assert table_row(out, "rnnsearch_tiny")[1][2] == "1"
    assert "warning: rnnsearch_tiny stopped on the 0.0005-minute time limit at update 1 of 300" in out


def test_averaging_window_keeps_to_the_end_of_the_training_done(tmp_path):
    for update in range(50, 1501, 50):  # a checkpoint every 1/30 of a 1,500-update budget
        (tmp_path / f"checkpoint_1_{update}.pt").touch()
    (tmp_path / "checkpoint_last.pt").touch()
    chosen = lambda done: [p.rsplit("_", 1)[1] for p in averaging_window(str(tmp_path), 5, done, 5 / 30)]  # noqa: E731
    assert chosen(1500) == ["1300.pt", "1350.pt", "1400.pt", "1450.pt", "1500.pt"]  # the whole budget: the last 5
    # Stopped on time at update 251 (the run): not updates 50-250 from near-random weights
    # on, only what lies in the last sixth of the 251 done.
    assert chosen(251) == ["250.pt"]
    assert chosen(600) == ["550.pt", "600.pt"]
    assert chosen(40) == []  # no checkpoint in the window: the caller scores checkpoint_last.pt
    assert [p.rsplit("_", 1)[1] for p in averaging_window(str(tmp_path), 5, 300, 1.0)] == [
        "100.pt", "150.pt", "200.pt", "250.pt", "300.pt"]  # fraction 1: nothing after the updates done


def load_quickstart():
    spec = importlib.util.spec_from_file_location("quickstart", f"{REPO}/scripts/quickstart.py")
    quickstart = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quickstart)
    return quickstart


def test_a_family_below_its_bleu_floor_fails_the_quickstart():
    """README command 1 exits 1 naming a family that did not learn on its whole budget; a run with
    another --max-update, or one stopped on its time limit, is not held to the floors."""
    quickstart = load_quickstart()
    assert set(quickstart.FLOORS) == set(quickstart.FAMILIES)
    learned = {"model": "rnnencdec_tiny", "bleu": "15.9", "updates": 2000}
    flat = {**learned, "bleu": "0.4"}
    assert quickstart.not_learned([learned], None) == []
    [line] = quickstart.not_learned([learned, flat], None)
    assert line.startswith("rnnencdec_tiny: BLEU 0.4 after 2,000 updates, below the 8") and "did not learn" in line
    assert quickstart.not_learned([flat], 50) == [] == quickstart.not_learned([{**flat, "stopped_on_time": True}], None)


def test_the_recorded_run_at_the_real_budgets_passes_every_floor():
    """docs/RESULTS.md's table of the quickstart at its default budgets (a real run) meets the
    floors: the floors fail no run that learned as that one did."""
    quickstart = load_quickstart()
    section = open(f"{REPO}/docs/RESULTS.md", encoding="utf-8").read().split("\n## Quickstart\n")[1].split("\n## ")[0]
    rows = [cells for cells in ([cell.strip() for cell in line.strip().strip("|").split("|")]
                                for line in section.splitlines() if line.startswith("| "))
            if cells[0] in quickstart.FAMILIES and len(cells) == 6]  # | model | parameters | updates | ... |
    assert [row[0] for row in rows] == list(quickstart.FAMILIES)
    recorded = [{"model": model, "updates": int(updates.replace(",", "")), "bleu": bleu}
                for model, _, updates, _, bleu, _ in rows]
    assert [r["updates"] for r in recorded] == [updates for _, updates in quickstart.FAMILIES.values()]
    assert quickstart.not_learned(recorded, None) == []


@pytest.mark.slow
def test_families_that_cannot_learn_fail_the_quickstart_at_their_real_budgets(tmp_path):
    """README command 1 with the Transformer's and RNNsearch's own budgets (400 updates each) on 10
    training sentences, from which no model translates the test set: the command exits 1 with one
    error line per family, as a user would see a family that did not learn."""
    quickstart = load_quickstart()
    models = ["vaswani_transformer_tiny", "rnnsearch_tiny"]
    proc = run([sys.executable, f"{REPO}/scripts/quickstart.py", "--work", tmp_path, "--train", "10", "--test", "20",
                "--max-len", "10", "--models", *models], check=False)
    assert proc.returncode == 1, proc.stdout[-3000:]
    errors = [line for line in proc.stdout.splitlines() if line.startswith("error: ")]
    assert len(errors) == len(models), proc.stdout[-3000:]
    for model, error in zip(models, errors):
        _, (_, _, updates, _, bleu, _) = table_row(proc.stdout, model)
        assert updates == f"{quickstart.FAMILIES[model][1]:,}"
        assert error.startswith(f"error: {model}: BLEU {bleu} after {updates} updates, below the "
                                f"{quickstart.FLOORS[model]:g} ") and error.endswith("it did not learn")
