"""README command #1 on a tiny budget: it runs end to end, prints its table, and skips done steps."""
import sys

import pytest

from helpers import REPO, run

pytestmark = pytest.mark.slow


def test_quickstart_runs_and_resumes(tmp_path):
    cmd = [sys.executable, f"{REPO}/scripts/quickstart.py", "--work", tmp_path, "--models", "rnnencdec_tiny",
           "--train", "300", "--test", "20", "--max-len", "10", "--max-update", "3"]
    out = run(cmd)
    assert "fairseq-train" in out and "train_inner" in out  # progress is shown
    row = [line for line in out.splitlines() if line.startswith("| rnnencdec_tiny |")]
    assert len(row) == 1
    _, params, minutes, bleu, chrf = [cell.strip() for cell in row[0].strip("|").split("|")]
    assert int(params.replace(",", "")) > 1000 and 0 <= float(bleu) <= 100 and 0 <= float(chrf) <= 100
    assert "(test set: 20 sentences" in out
    again = run(cmd)
    assert "done before, skipping" in again and "fairseq-train" not in again.split("done before")[0]
    assert row[0] in again
