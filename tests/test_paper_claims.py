"""The paper-claims experiment: the verdict rule on hand-made numbers, and --quick end to end."""
import csv
import sys

import pytest

from fairseq_plugins_lab import claims
from helpers import REPO, run

VERDICTS = (claims.HOLDS, claims.FAILS, claims.NOT_SEPARABLE)


def test_holds_when_the_means_differ_by_more_than_the_larger_std():
    # means 11 and 9, both sample std 1: difference 2 > 1
    assert claims.compare([10, 11, 12], [8, 9, 10]).verdict == claims.HOLDS


def test_does_not_hold_when_the_difference_exceeds_the_spread_the_other_way():
    assert claims.compare([8, 9, 10], [10, 11, 12]).verdict == claims.FAILS


def test_not_separable_inside_the_spread():
    # the means differ by 0.5; the noisier side's std is 1
    assert claims.compare([10, 11, 12], [10.5, 10.5, 10.5]).verdict == claims.NOT_SEPARABLE
    # a difference equal to the spread is not enough
    assert claims.compare([2, 3, 4], [1, 2, 3]).verdict == claims.NOT_SEPARABLE


def test_spread_is_the_sample_std_of_the_noisier_side():
    # [0, 2]: sample std sqrt(2) = 1.41 (population std 1.0); difference 1.2 lies between
    c = claims.compare([0, 2], [-0.2, -0.2])
    assert c.spread == pytest.approx(2 ** 0.5)
    assert c.difference == pytest.approx(1.2)
    assert c.verdict == claims.NOT_SEPARABLE
    assert claims.compare([0, 2], [-0.5, -0.5]).verdict == claims.HOLDS  # 1.5 > 1.41


def test_one_value_against_seeds_uses_the_seeds_spread():
    # the ensemble claim: one BLEU against the three single models'
    assert claims.compare([13], [10, 11, 12]).verdict == claims.HOLDS
    assert claims.compare([12], [10, 11, 12]).verdict == claims.NOT_SEPARABLE
    assert claims.compare([10.5], [10, 11, 12]).verdict == claims.NOT_SEPARABLE
    assert claims.compare([8.5], [10, 11, 12]).verdict == claims.FAILS


def test_one_value_on_each_side_is_never_separable():
    assert claims.compare([50], [10]).verdict == claims.NOT_SEPARABLE


def test_describe_names_the_verdict_the_means_and_the_rule():
    assert (claims.describe(claims.compare([10, 11, 12], [8, 9, 10]))
            == "holds (11.0 ± 1.0 vs 9.0 ± 1.0; d = +2.0 > spread 1.0)")
    assert (claims.describe(claims.compare([8, 9, 10], [10, 11, 12]))
            == "does not hold (9.0 ± 1.0 vs 11.0 ± 1.0; d = -2.0 < -spread 1.0)")
    assert (claims.describe(claims.compare([12], [10, 11, 12]))
            == "not separable from seed spread (12.0 vs 11.0 ± 1.0; d = +1.0 within spread 1.0)")


def test_quantile_edges_cut_into_equal_groups():
    assert claims.quantile_edges(list(range(1, 13)), 3) == [1, 5, 9]  # 1-4, 5-8, 9-12
    assert claims.quantile_edges([5] * 9, 3) == [5]  # all tied: one bucket


@pytest.mark.slow
def test_quick_experiment_gives_every_claim_one_verdict(tmp_path):
    run([sys.executable, f"{REPO}/examples/paper_claims/run.py", "--quick", "--work", tmp_path])
    report = (tmp_path / "REPORT.md").read_text()
    table = report.split("## Verdicts", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| claim |")]
    claim_texts = ["RNNsearch-50 above RNNencdec-50", "RNNencdec-50 falls with length",
                   "RNNsearch-50 does not fall with length", "reversed source above plain", "ensemble of the seeds'",
                   "makes perplexity worse", "makes BLEU better", "average of the last 5 checkpoints",
                   "same wall-clock minutes"]
    assert len(rows) == len(claim_texts)
    for text in claim_texts:
        matching = [row for row in rows if text in row]
        assert len(matching) == 1, text
        cells = matching[0].strip("|").split(" | ")[1:]  # one per corpus: only synthetic in --quick
        assert len(cells) == 1
        assert sum(cells[0].startswith(v) for v in VERDICTS) == 1, cells[0]
    with open(tmp_path / "claims.csv") as f:
        rows = list(csv.DictReader(f))
    seeds = {(r["model"], r["seed"]) for r in rows}
    for model in ("rnnencdec-50", "rnnsearch-50", "seq2seq-reversed", "seq2seq-plain", "transformer-ls0.1",
                  "transformer-ls0", "rnnsearch-clock", "transformer-clock"):
        assert {(model, "1"), (model, "2")} <= seeds
    assert all(r["scored_valid_ppl"] for r in rows if r["model"].startswith("transformer-ls"))
    for picture in ("bleu_by_length-synthetic.png", "curves-synthetic.png"):
        assert (tmp_path / picture).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"({picture})" in report
    assert "alignments-synthetic/alignment-" in report
