"""The memory soak (scripts/soak.py): its verdict on known series, and a tiny end-to-end run."""
import sys

import pytest
from PIL import Image

from fairseq_plugins_lab.memory import verdict
from helpers import REPO, run


def test_verdict_flat_series_with_spikes_is_no_growth():
    samples = [(0, 200), (1, 400), (2, 500), (3, 501), (4, 560), (5, 499), (6, 502), (7, 500), (8, 501)]
    result = verdict(samples, warmup_minutes=2, tolerance=0.05)
    assert not result["grew"]
    assert result["start_mib"] == 501 and result["end_mib"] == 501 and result["peak_mib"] == 560


def test_verdict_steady_leak_is_growth():
    samples = [(t, 500 + 10 * t) for t in range(12)]  # 10 MiB a minute
    result = verdict(samples, warmup_minutes=2, tolerance=0.05)
    assert result["grew"]
    assert result["slope_mib_per_hour"] == pytest.approx(600)
    assert result["growth"] == pytest.approx((600 - 530) / 530)  # t=3 against t=10


def test_verdict_needs_samples_after_warmup():
    with pytest.raises(ValueError, match="at least 6 samples after the 5-minute warm-up, got 2"):
        verdict([(t, 100) for t in range(7)], warmup_minutes=5, tolerance=0.05)


@pytest.mark.slow
def test_soak_runs_and_reports(tmp_path):
    out = run([sys.executable, f"{REPO}/scripts/soak.py", "--work", tmp_path, "--minutes", "0.35",
               "--sample-seconds", "2", "--warmup-minutes", "0.05", "--interval", "10", "--train", "500",
               "--tolerance", "10"])
    assert "RSS grew" in out
    rows = open(tmp_path / "memory.csv").read().splitlines()
    assert rows[0] == "minute,rss_mib" and len(rows) >= 8
    rss = [float(r.split(",")[1]) for r in rows[1:]]
    assert all(0 < m < 8000 for m in rss) and max(rss) > 50  # the first sample may precede the imports
    report = open(tmp_path / "memory.md").read()
    assert "validations" in report and "![memory](memory.png)" in report
    assert " 0 validations" not in report and " 0 checkpoints" not in report
    assert Image.open(tmp_path / "memory.png").size == (700, 350)
