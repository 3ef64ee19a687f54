"""The paper-claims experiment end to end: --quick trains every model for 5 updates, 2 seeds, and
must still decide every claim by the paired tests and write the report, the plots and claims.csv."""
import csv
import sys

import pytest

from fairseq_plugins_lab import claims
from helpers import REPO, run

VERDICTS = (claims.HOLDS, claims.FAILS, claims.UNDECIDED)
CLAIM_TEXTS = ["RNNsearch-50 above RNNencdec-50, BLEU", "on the longest third of the test sources",
               "RNNencdec-50 falls with length", "RNNsearch-50 does not fall with length", "reversed source above plain",
               "ensemble of the seeds'", "makes perplexity worse", "makes BLEU better",
               "average of the last 5 checkpoints", "same training minutes", "same training FLOPs"]


@pytest.mark.slow
def test_quick_experiment_gives_every_claim_one_verdict(tmp_path):
    run([sys.executable, f"{REPO}/examples/paper_claims/run.py", "--quick", "--work", tmp_path])
    report = (tmp_path / "REPORT.md").read_text()
    table = report.split("## Verdicts", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| claim |")]
    assert len(rows) == len(CLAIM_TEXTS)
    for text in CLAIM_TEXTS:
        matching = [row for row in rows if text in row]
        assert len(matching) == 1, text
        cells = matching[0].strip("|").split(" | ")[1:]  # one per corpus: only synthetic in --quick
        assert len(cells) == 1
        assert sum(cells[0].startswith(v) for v in VERDICTS) == 1, cells[0]
        assert cells[0].count("seed 1:") == 1 and cells[0].count("seed 2:") == 1, cells[0]
    with open(tmp_path / "claims.csv") as f:
        comparisons, _, models = f.read().partition("\n\n")
    decided = list(csv.DictReader(comparisons.splitlines()))
    assert {r["claim"] for r in decided} == {key for key in (
        "search", "search_long", "encdec_falls", "search_flat", "reverse", "ensemble", "ls_ppl", "ls_bleu",
        "average", "clock_minutes", "clock_flops")}
    assert all(0 < float(r["p_bootstrap"]) <= 1 for r in decided)
    assert all(r["p_ar"] for r in decided if r["claim"] not in ("encdec_falls", "search_flat", "ls_ppl"))
    rows = list(csv.DictReader(models.strip().splitlines()))
    seeds = {(r["model"], r["seed"]) for r in rows}
    for model in ("rnnencdec-50", "rnnsearch-50", "seq2seq-reversed", "seq2seq-plain", "transformer-ls0.1",
                  "transformer-ls0"):
        assert {(model, "1"), (model, "2")} <= seeds
    assert all(r["scored_valid_ppl"] for r in rows if r["model"].startswith("transformer-ls"))
    assert "## Transformer vs RNNsearch at equal compute (synthetic)" in report
    for picture in ("bleu_by_length-synthetic.png", "curves-synthetic.png"):
        assert (tmp_path / picture).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"({picture})" in report
    assert "alignments-synthetic/alignment-" in report
