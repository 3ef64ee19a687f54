"""The paper-claims experiment in --quick mode: the same code on a tiny budget produces its report."""
import re
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
    claims = [r"RNNsearch ahead of RNNencdec at both lengths: (yes|no)\.",
              r"RNNencdec falling with length \(.*\): (yes|no) \(",
              r"RNNsearch-50 flat past 50 words \(.*\): (yes|no) \(",
              r"Reversed ahead: (yes|no)\.",
              r"Perplexity worse with smoothing: (yes|no);",
              r"BLEU better or equal: (yes|no)\.",
              r"Average ahead or equal: (yes|no)\."]
    for claim in claims:  # every claim gets its own verdict, once
        assert len(re.findall(claim, report)) == 1, claim
    assert len(re.findall(r": (yes|no)\b", report)) == len(claims)
    assert "RNNsearch ahead" in out
