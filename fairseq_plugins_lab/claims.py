"""Verdicts on the papers' claims: machine translation's paired significance tests, seed by seed.

A claim says system ``a`` scores above system ``b`` (e.g. RNNsearch-50 above RNNencdec-50 in BLEU).
Each training seed gives one pair, trained alike but for what the claim is about, and scored on
the same test sentences. For every pair:

    d      = score(a) - score(b)
    p      BLEU: the larger of sacrebleu's two paired tests, paired bootstrap resampling
           (Koehn 2004; 1,000 resamples) and approximate randomization (10,000 trials), used
           as a library (``sacrebleu --paired-bs / --paired-ar`` print the same p-values);
           other scores (perplexity, BLEU of disjoint sentence sets): the bootstrap p-value
           computed as sacrebleu computes it (``bootstrap``)
    95% CI of d: its 2.5th and 97.5th percentiles over the bootstrap resamples

and the claim

    holds          if every pair has d > 0 with p < 0.05
    does not hold  if every pair has d < 0 with p < 0.05
    not decided    otherwise; the verdict names the seeds on each side and those without a
                   significant difference (p >= 0.05, or d = 0: identical scores)

``ALPHA`` is 0.05 for every pair (no correction for the number of seeds: a claim needs all of
them, which is stricter than any one test at 0.05).
"""
import os
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import logging

import numpy as np
import sacrebleu
from sacrebleu.significance import PairedTest

from fairseq_plugins.analysis.bleu_by_length import quantile_edges  # noqa: F401  (bleu-by-length's default buckets)

HOLDS = "holds"
FAILS = "does not hold"
UNDECIDED = "not decided"
ALPHA = 0.05
BOOTSTRAP_SAMPLES = 1000  # sacrebleu's defaults
logging.getLogger("sacrebleu").setLevel(logging.WARNING)  # its tests log each step at INFO
AR_TRIALS = 10000


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def std(values: Sequence[float]) -> Optional[float]:
    """Sample standard deviation (n - 1); None for fewer than two values."""
    if len(values) < 2:
        return None
    m = mean(values)
    return (sum((v - m) ** 2 for v in values) / (len(values) - 1)) ** 0.5


def mean_std(values: Sequence[float], digits: int = 1) -> str:
    """``12.3 ± 0.4`` (one value: just the value)."""
    s = std(values)
    return f"{mean(values):.{digits}f}" + ("" if s is None else f" ± {s:.{digits}f}")


@dataclass
class Pair:
    """One seed's comparison of ``a`` with ``b``."""
    seed: str
    a: float
    b: float
    low: float  # 95% CI of a - b
    high: float
    p_bs: float
    p_ar: Optional[float] = None  # BLEU only

    @property
    def difference(self) -> float:
        return self.a - self.b

    @property
    def p(self) -> float:
        return max(p for p in (self.p_bs, self.p_ar) if p is not None)

    @property
    def sign(self) -> int:
        """+1 / -1: a significant difference in that direction; 0: not significant."""
        if self.p >= ALPHA or self.difference == 0:
            return 0
        return 1 if self.difference > 0 else -1


def sacrebleu_seed() -> Optional[int]:
    """The resampling seed sacrebleu's paired tests use (``SACREBLEU_SEED``, default 12345)."""
    seed = os.environ.get("SACREBLEU_SEED", "12345")
    return None if seed.lower() == "none" else int(seed)


def _ci(samples: np.ndarray):
    # sacrebleu's estimate_ci: the sorted resamples' 1/40th from each end
    s = np.sort(samples)
    k = len(s) // 40
    return float(s[k]), float(s[len(s) - k - 1])


def bootstrap(stats_a, stats_b, score_a: Callable, score_b: Callable = None, paired: bool = True,
              samples: int = BOOTSTRAP_SAMPLES):
    """(score a, score b, CI low, CI high, p) of ``score_a(stats_a) - score_b(stats_b)``.

    ``stats_*`` hold one row of sufficient statistics per sentence; a score takes their column
    sums. Paired: both sides resampled with the same sentence indices (one test set), as
    sacrebleu's paired bootstrap does; unpaired: each side with its own (two sentence sets).
    p is sacrebleu's: the share of resamples whose |difference|, centred on its mean, exceeds the
    observed |difference|, with the +1 of both counts.
    """
    score_b = score_b or score_a
    a, b = np.asarray(stats_a, dtype="float32"), np.asarray(stats_b, dtype="float32")
    if paired and len(a) != len(b):
        raise ValueError(f"paired bootstrap needs the same sentences: {len(a)} vs {len(b)}")
    rng = np.random.default_rng(sacrebleu_seed())
    idx_a = rng.choice(len(a), size=(samples, len(a)), replace=True)
    idx_b = idx_a if paired else rng.choice(len(b), size=(samples, len(b)), replace=True)
    real_a, real_b = score_a(a.sum(0)), score_b(b.sum(0))
    diffs = np.array([score_a(sa.sum(0)) - score_b(sb.sum(0)) for sa, sb in zip(a[idx_a], b[idx_b])])
    centred = np.abs(diffs) - np.abs(diffs).mean()
    p = (np.sum(centred > abs(real_a - real_b)).item() + 1) / (samples + 1)
    return (real_a, real_b, *_ci(diffs), p)


def bleu_stats(hyps: Sequence[str], refs: Sequence[str]):
    """Per-sentence BLEU sufficient statistics (sacrebleu's 13a tokenisation), and their score."""
    metric = sacrebleu.BLEU()
    return (np.asarray(metric._extract_corpus_statistics(list(hyps), [list(refs)])),
            lambda sums: metric._compute_score_from_stats(list(sums)).score)


def bleu_pair(seed, hyps_a: Sequence[str], hyps_b: Sequence[str], refs: Sequence[str]) -> Pair:
    """``a`` vs ``b`` in BLEU on one test set: sacrebleu's paired bootstrap and AR p-values."""
    p = {}
    for test in ("bs", "ar"):
        _, results = PairedTest([("b", list(hyps_b)), ("a", list(hyps_a))], {"BLEU": sacrebleu.BLEU()},
                                [list(refs)], test_type=test, n_samples=AR_TRIALS if test == "ar" else
                                BOOTSTRAP_SAMPLES)()
        p[test] = results["BLEU"][1].p_value
    stats_a, score = bleu_stats(hyps_a, refs)
    stats_b, _ = bleu_stats(hyps_b, refs)
    a, b, low, high, _ = bootstrap(stats_a, stats_b, score)
    return Pair(str(seed), a, b, low, high, p["bs"], p["ar"])


def bleu_sets_pair(seed, set_a, set_b, scale_b: float = 1.0) -> Pair:
    """BLEU of one sentence set (hyps, refs) against ``scale_b`` times that of another (unpaired)."""
    stats_a, score = bleu_stats(*set_a)
    stats_b, _ = bleu_stats(*set_b)
    a, b, low, high, p = bootstrap(stats_a, stats_b, score, lambda s: scale_b * score(s), paired=False)
    return Pair(str(seed), a, b, low, high, p)


def perplexity(sums) -> float:
    """2 ** (bits / tokens) from the column sums of (bits, tokens) rows."""
    return float(2 ** (sums[0] / sums[1]))


def perplexity_pair(seed, rows_a, rows_b) -> Pair:
    """Perplexity of ``a`` vs ``b`` on the same sentences; rows: (-log2 p of the sentence, tokens)."""
    return Pair(str(seed), *bootstrap(rows_a, rows_b, perplexity))


@dataclass
class Verdict:
    pairs: List[Pair]
    verdict: str


def decide(pairs: Sequence[Pair]) -> Verdict:
    """The verdict of the module docstring's rule on one claim's seed pairs."""
    if not pairs:
        raise ValueError("decide needs at least one seed pair")
    signs = {pair.sign for pair in pairs}
    verdict = HOLDS if signs == {1} else FAILS if signs == {-1} else UNDECIDED
    return Verdict(list(pairs), verdict)


def _p(p: float) -> str:
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def describe(v: Verdict, digits: int = 1) -> str:
    """``holds on seeds 1, 2, 3 (...)`` with every seed's d, CI and p; no ``|``: it sits in a table cell."""
    f = f"+.{digits}f"
    detail = "; ".join(f"seed {x.seed}: {x.a:.{digits}f} vs {x.b:.{digits}f}, d = {x.difference:{f}} "
                       f"[{x.low:{f}}, {x.high:{f}}], {_p(x.p)}" for x in v.pairs)
    if v.verdict != UNDECIDED:
        return f"{v.verdict} on every seed ({detail})"
    groups = [(1, "holds on"), (-1, "reversed on"), (0, "no significant difference on")]
    parts = [f"{label} {'seed' if n == 1 else 'seeds'} {', '.join(x.seed for x in v.pairs if x.sign == s)}"
             for s, label in groups for n in [sum(x.sign == s for x in v.pairs)] if n]
    if any(x.sign == 0 for x in v.pairs):  # a seed without a decision: say how fine the test could see
        width = mean([(x.high - x.low) / 2 for x in v.pairs])
        parts.append(f"the 95% intervals are ±{width:.{digits}f} wide on average, so a smaller difference "
                     "cannot be resolved on these sentences")
    return f"{UNDECIDED}: {'; '.join(parts)} ({detail})"


def plot_bands(path: str, labels: Sequence[str], series: dict, ylabel: str = "BLEU", title: str = ""):
    """One line per system over the buckets: the mean across seeds, shaded mean ± std.

    ``series`` maps a system's name to one list per bucket of its seeds' scores (an empty list
    for an empty bucket).
    """
    from fairseq_plugins.analysis.report import pyplot, save_figure

    fig, ax = pyplot().subplots(figsize=(6.4, 4))
    for name, buckets in series.items():
        x = [i for i, scores in enumerate(buckets) if scores]
        means = [mean(buckets[i]) for i in x]
        stds = [std(buckets[i]) or 0.0 for i in x]
        ax.plot(x, means, marker="o", label=name)
        ax.fill_between(x, [m - s for m, s in zip(means, stds)], [m + s for m, s in zip(means, stds)], alpha=0.25)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels)
    ax.set_xlabel("source sentence length (words)")
    ax.set_ylabel(f"{ylabel} (mean ± std over seeds)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)
