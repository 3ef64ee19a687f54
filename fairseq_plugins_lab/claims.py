"""Verdicts on the papers' claims from several training seeds.

A claim compares two sets of numbers, ``a`` and ``b`` (e.g. the BLEU of RNNsearch-50 trained
with seeds 1, 2, 3 and that of RNNencdec-50 with the same seeds) and says ``a`` is above ``b``.
The rule (the same for every claim):

    difference = mean(a) - mean(b)
    spread     = max(std(a), std(b))   sample standard deviation (n - 1), over the sides with
                                       at least two values
    holds                          if  difference >  spread
    does not hold                  if  difference < -spread
    not separable from seed spread otherwise (also: no side has two values, or spread is 0
                                       and the difference too)

So a claim holds only when the means differ by more than one seed-to-seed standard deviation
of the noisier side, in the claimed direction; it fails only when they differ that much the
other way. With three seeds this is a rule of thumb, not a significance test.
"""
import math
from dataclasses import dataclass
from typing import Optional, Sequence

from fairseq_plugins.analysis.bleu_by_length import quantile_edges  # noqa: F401  (bleu-by-length's default buckets)

HOLDS = "holds"
FAILS = "does not hold"
NOT_SEPARABLE = "not separable from seed spread"


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def std(values: Sequence[float]) -> Optional[float]:
    """Sample standard deviation (n - 1); None for fewer than two values."""
    if len(values) < 2:
        return None
    m = mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


@dataclass
class Comparison:
    a: Sequence[float]
    b: Sequence[float]
    difference: float
    spread: Optional[float]
    verdict: str


def compare(a: Sequence[float], b: Sequence[float]) -> Comparison:
    """The verdict on "``a`` is above ``b``" by the rule of the module docstring."""
    if not a or not b:
        raise ValueError("compare needs at least one value on each side")
    difference = mean(a) - mean(b)
    spreads = [s for s in (std(a), std(b)) if s is not None]
    spread = max(spreads) if spreads else None
    if spread is None or (spread == 0 and difference == 0):
        verdict = NOT_SEPARABLE
    elif difference > spread:
        verdict = HOLDS
    elif difference < -spread:
        verdict = FAILS
    else:
        verdict = NOT_SEPARABLE
    return Comparison(list(a), list(b), difference, spread, verdict)


def mean_std(values: Sequence[float], digits: int = 1) -> str:
    """``12.3 ± 0.4`` (one value: just the value)."""
    s = std(values)
    return f"{mean(values):.{digits}f}" + ("" if s is None else f" ± {s:.{digits}f}")


def describe(c: Comparison, digits: int = 1) -> str:
    """``holds (12.3 ± 0.4 vs 10.1 ± 0.9; d = +2.2 > spread 0.9)`` (no ``|``: it sits in a table cell)."""
    d = f"d = {c.difference:+.{digits}f}"
    if c.spread is None:
        relation = f"{d}, no spread (one value per side)"
    elif c.verdict == HOLDS:
        relation = f"{d} > spread {c.spread:.{digits}f}"
    elif c.verdict == FAILS:
        relation = f"{d} < -spread {c.spread:.{digits}f}"
    else:
        relation = f"{d} within spread {c.spread:.{digits}f}"
    return f"{c.verdict} ({mean_std(c.a, digits)} vs {mean_std(c.b, digits)}; {relation})"


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
