"""The paper-claims experiment in --quick mode: the same code on a tiny budget produces its report."""
import os
import sys

import pytest

from helpers import REPO, run

pytestmark = pytest.mark.slow


def test_quick_experiment_writes_report(tmp_path):
    out = run([sys.executable, f"{REPO}/examples/paper_claims/run.py", "--quick", "--work", tmp_path])
    report = (tmp_path / "REPORT.md").read_text()
    for section in ("RNNencdec vs RNNsearch", "reversed source", "Label smoothing", "Checkpoint averaging",
                    "Training curves"):
        assert section in report
    for name in ("rnnencdec-30", "rnnsearch-30", "rnnencdec-50", "rnnsearch-50", "seq2seq-reversed",
                 "seq2seq-plain", "transformer-ls0.1", "transformer-ls0"):
        assert f"| {name} |" in report
    for picture in ("bleu_by_length.png", "curves.png", "alignments/alignment-0.png"):
        assert (tmp_path / picture).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"({picture})" in report
    assert report.count(": yes") + report.count(": no") >= 4  # every claim gets a verdict
    assert "RNNsearch ahead" in out
