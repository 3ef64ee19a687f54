"""examples/parity/run.py, the command behind docs/RESULTS.md's training-parity table, run as a
user runs it on tiny sizes: every run trains, translates and is scored, and the table holds the
mean and sample standard deviation of what the runs scored."""
import json
import os
import statistics

import pytest

from helpers import REPO, run

SCRIPT = os.path.join(REPO, "examples", "parity", "run.py")


@pytest.mark.slow
def test_parity_table_summarises_every_seed_of_every_run(data_bin, tmp_path):
    out = run(["python", SCRIPT, "--data", data_bin, "--source-lang", "src", "--target-lang", "tgt",
               "--work", tmp_path, "--size", "tiny", "--updates", "3", "--seeds", "1", "2",
               "--runs", "vaswani_transformer,rnnsearch", "--jobs", "2"])
    results = json.loads((tmp_path / "parity.json").read_text())
    assert sorted((r["run"], r["seed"]) for r in results) == [
        ("rnnsearch", 1), ("rnnsearch", 2), ("vaswani_transformer", 1), ("vaswani_transformer", 2)]
    assert all(r["updates"] == 3 and r["sentences"] == 30 and r["wps"] > 0 for r in results)
    rows = {line.split(" | ")[0].strip("| "): line for line in out.splitlines() if line.startswith("| ")}
    for name in ("vaswani_transformer", "rnnsearch"):
        bleu = [r["bleu"] for r in results if r["run"] == name]
        assert f"{statistics.mean(bleu):.2f} ± {statistics.stdev(bleu):.2f}" in rows[name]


def test_parity_refuses_an_unknown_run_in_one_line(data_bin, tmp_path):
    proc = run(["python", SCRIPT, "--data", data_bin, "--source-lang", "src", "--target-lang", "tgt",
                "--work", tmp_path, "--runs", "transformer,rnnsarch"], check=False)
    assert proc.returncode == 2 and "--runs: unknown run 'rnnsarch'" in proc.stdout
