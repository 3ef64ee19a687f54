"""The verdict rule of fairseq_plugins_lab/claims.py on hand-made numbers, and its p-values against
sacrebleu's own command line (``sacrebleu REF -i BASELINE SYSTEM --paired-bs / --paired-ar``)."""
import json
import os
import random
import sys

import numpy as np
import pytest
import sacrebleu

from fairseq_plugins_lab import claims
from helpers import run

WORDS = "the cat sat on a mat with dog and bird in house near red blue tree".split()


def systems(n=80, rates=(0.15, 0.35), seed=0):
    """References and two hypothesis lists, each a copy of the reference with some words swapped."""
    rng = random.Random(seed)
    refs = [" ".join(rng.choices(WORDS, k=rng.randint(5, 15))) for _ in range(n)]
    hyps = [[" ".join(w if rng.random() > rate else rng.choice(WORDS) for w in r.split()) for r in refs]
            for rate in rates]
    return refs, hyps[0], hyps[1]


def sacrebleu_cli(tmp_path, refs, baseline, system, test):
    for name, lines in (("ref", refs), ("base", baseline), ("sys", system)):
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    out = run([os.path.join(os.path.dirname(sys.executable), "sacrebleu"), tmp_path / "ref", "-i", tmp_path / "base",
               tmp_path / "sys", f"--paired-{test}", "-m", "bleu", "--format", "json", "--quiet"])
    return json.loads(out[out.index("["):])[1]["BLEU"]


@pytest.mark.parametrize("rates", [(0.15, 0.35), (0.25, 0.27)])
def test_bleu_pair_p_values_are_sacrebleus(tmp_path, rates):
    # one clear difference, one too small to be significant on 80 sentences
    refs, a, b = systems(rates=rates)
    pair = claims.bleu_pair(1, a, b, refs)
    bs, ar = sacrebleu_cli(tmp_path, refs, b, a, "bs"), sacrebleu_cli(tmp_path, refs, b, a, "ar")
    assert pair.p_bs == pytest.approx(bs["p_value"])
    assert pair.p_ar == pytest.approx(ar["p_value"])
    assert pair.a == pytest.approx(bs["score"], abs=1e-4)
    assert pair.b == pytest.approx(sacrebleu.corpus_bleu(b, [refs]).score)
    assert pair.p == max(pair.p_bs, pair.p_ar)
    assert pair.low < pair.difference < pair.high


def test_the_generic_bootstrap_is_sacrebleus_paired_bootstrap():
    # the one used for perplexity and the length thirds: on BLEU statistics it gives sacrebleu's p
    refs, a, b = systems(rates=(0.2, 0.3))
    stats_a, score = claims.bleu_stats(a, refs)
    stats_b, _ = claims.bleu_stats(b, refs)
    real_a, real_b, low, high, p = claims.bootstrap(stats_a, stats_b, score)
    assert real_a == pytest.approx(sacrebleu.corpus_bleu(a, [refs]).score)
    assert p == pytest.approx(claims.bleu_pair(1, a, b, refs).p_bs)
    assert low < real_a - real_b < high


def test_bootstrap_interval_of_a_known_difference():
    # score = mean of column 0; a is b + 1 on every sentence: every resample's difference is exactly 1
    rng = np.random.default_rng(0)
    b = rng.normal(size=(50, 1))
    a = b + 1
    score = lambda sums: float(sums[0]) / 50
    real_a, real_b, low, high, p = claims.bootstrap(a, b, score)
    assert (real_a - real_b, low, high) == pytest.approx((1, 1, 1), abs=1e-5)
    assert p == pytest.approx(1 / 1001)  # no resample's centred |d| exceeds the observed one: sacrebleu's +1


def test_perplexity_pair_on_hand_made_rows():
    # rows: (bits, tokens); a spends 1 bit more per token on every sentence than b's 2
    rng = random.Random(1)
    tokens = [rng.randint(3, 9) for _ in range(60)]
    b = [(2.0 * t + rng.uniform(-0.5, 0.5), t) for t in tokens]
    a = [(bits + t, t) for bits, t in b]
    pair = claims.perplexity_pair(3, a, b)
    total = sum(tokens)
    assert pair.b == pytest.approx(2 ** (sum(x for x, _ in b) / total), rel=1e-5)
    assert pair.a == pytest.approx(2 ** (sum(x for x, _ in a) / total), rel=1e-5)
    assert pair.sign == 1 and pair.p_ar is None and pair.seed == "3"


def test_sentence_sets_pair_scales_the_second_set():
    refs, a, _ = systems(n=60, rates=(0.1, 0.1))
    first, second = (a[:30], refs[:30]), (a[30:], refs[30:])
    pair = claims.bleu_sets_pair(2, first, second, scale_b=0.9)
    assert pair.a == pytest.approx(sacrebleu.corpus_bleu(*[first[0], [first[1]]]).score)
    assert pair.b == pytest.approx(0.9 * sacrebleu.corpus_bleu(second[0], [second[1]]).score)
    assert pair.low < pair.difference < pair.high


def pair(seed, d, p):
    return claims.Pair(str(seed), 10 + d, 10, d - 1, d + 1, p)


def test_holds_only_when_every_seed_is_significant_in_the_papers_direction():
    assert claims.decide([pair(1, 2, 0.01), pair(2, 1, 0.001), pair(3, 0.5, 0.04)]).verdict == claims.HOLDS
    assert claims.decide([pair(1, -2, 0.01), pair(2, -1, 0.001)]).verdict == claims.FAILS
    # one seed not significant, or one reversed: not decided
    assert claims.decide([pair(1, 2, 0.01), pair(2, 1, 0.05)]).verdict == claims.UNDECIDED
    assert claims.decide([pair(1, 2, 0.01), pair(2, -1, 0.01)]).verdict == claims.UNDECIDED


def test_p_is_the_larger_of_the_two_tests():
    x = claims.Pair("1", 12, 10, 1, 3, p_bs=0.01, p_ar=0.2)
    assert x.p == 0.2 and x.sign == 0
    assert claims.Pair("1", 12, 10, 1, 3, p_bs=0.2, p_ar=0.01).sign == 0
    assert claims.Pair("1", 12, 10, 1, 3, p_bs=0.01, p_ar=0.02).sign == 1
    # identical scores: sacrebleu's p is its floor 1/(n+1), yet there is no difference to decide on
    assert claims.Pair("1", 10, 10, 0, 0, p_bs=0.001, p_ar=0.0001).sign == 0


def test_describe_names_each_seeds_difference_interval_and_p():
    v = claims.decide([pair(1, 2, 0.0001), pair(2, 1, 0.02)])
    assert claims.describe(v) == ("holds on every seed (seed 1: 12.0 vs 10.0, d = +2.0 [+1.0, +3.0], p < 0.001; "
                                  "seed 2: 11.0 vs 10.0, d = +1.0 [+0.0, +2.0], p = 0.020)")
    mixed = claims.describe(claims.decide([pair(1, 2, 0.01), pair(2, -1, 0.01), pair(3, 1, 0.3)]))
    assert mixed.startswith("not decided: holds on seed 1; reversed on seed 2; no significant difference on seed 3; "
                            "the 95% intervals are ±1.0 wide on average, so a smaller difference cannot be resolved "
                            "on these sentences (")
    assert "|" not in mixed  # it sits in a table cell
    opposite = claims.describe(claims.decide([pair(1, 2, 0.01), pair(2, -1, 0.01)]))
    assert opposite.startswith("not decided: holds on seed 1; reversed on seed 2 (")  # no resolution to blame


def test_quantile_edges_cut_into_equal_groups():
    assert claims.quantile_edges(list(range(1, 13)), 3) == [1, 5, 9]  # 1-4, 5-8, 9-12
    assert claims.quantile_edges([5] * 9, 3) == [5]  # all tied: one bucket
