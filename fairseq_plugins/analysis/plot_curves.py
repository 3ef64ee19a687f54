"""Training curves of fairseq-train runs: train/valid loss, perplexity and learning rate.

    fairseq-plugins-plot-curves --log base=base/train.log --log ls=ls/train.log --out curves

Reads what fairseq-train writes to the console (or ``--log-file``) with ``--log-format simple``
(``epoch 001:  100 / 500 loss=5.2, ppl=36.8, ..., num_updates=100, lr=0.0005`` and
``epoch 001 | valid on 'valid' subset | loss 4.9 | ppl 29.6 | ... | num_updates 500``) or
``--log-format json`` (``{"epoch": 1, "loss": "5.2", ..., "num_updates": "100"}``,
``{"epoch": 1, "valid_loss": "4.9", ..., "valid_num_updates": "500"}``); other lines are
ignored. The train curve uses the ``--log-interval`` lines, or the end-of-epoch averages when
a log has none; every validation is a point of the valid curve. x = number of updates; fairseq
logs losses in base 2 and ppl = 2^nll_loss. The loss panel plots a label-smoothed run's
``nll_loss`` (its ``loss`` includes the smoothing term), so runs of either criterion compare.
Writes PREFIX.png (three panels) and PREFIX.md (final values of each run, ``loss`` as logged).
"""
import json
import math
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from fairseq_plugins.analysis import generate_output, report
from fairseq_plugins.errors import ConfigError

NUMBER = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|inf|nan)"
INNER = re.compile(r"epoch \d+:\s+\d+\s*/\s*\d+\s+(.*)$")  # simple format, every --log-interval
EPOCH = re.compile(r"\|\s*epoch \d+\s*\|")  # simple format, end of epoch or validation
VALID = re.compile(r"valid on '([^']+)' subset")
INNER_PAIR = re.compile(rf"(\w+)=({NUMBER})")
PIPE_PAIR = re.compile(rf"\|\s*(\w+) ({NUMBER})(?=\s*(?:\||$))")
METRICS = ("loss", "ppl", "lr")
# label_smoothed_cross_entropy's loss includes the smoothing term; its nll_loss is what cross_entropy logs as loss
NLL = "nll_loss"

Point = Dict[str, float]  # num_updates plus whatever of loss/ppl/lr the line has


@dataclass
class Run:
    name: str
    train_inner: List[Point] = field(default_factory=list)
    train_epoch: List[Point] = field(default_factory=list)
    valid: List[Point] = field(default_factory=list)

    @property
    def train(self) -> List[Point]:
        return self.train_inner or self.train_epoch


def point(stats: Dict[str, str], prefix: str = "") -> Optional[Point]:
    """Metrics of one log line (keys optionally prefixed like ``valid_loss``), None without updates."""
    values = {}
    for key in ("num_updates", NLL) + METRICS:
        if prefix + key in stats:
            try:
                values[key] = float(stats[prefix + key])
            except ValueError:
                continue
    return values if "num_updates" in values else None


def parse_json_line(line: str) -> Optional[Tuple[str, Point]]:
    start = line.find("{")
    try:
        stats = json.loads(line[start:])
    except ValueError:
        return None
    if not isinstance(stats, dict):
        return None
    if "num_updates" in stats:
        kind, prefix = "train_inner", ""
    else:
        prefixes = [k[: -len("num_updates")] for k in stats if k.endswith("_num_updates")]
        if not prefixes:
            return None
        prefix = prefixes[0]
        kind = "train_epoch" if prefix == "train_" else "valid"
    p = point(stats, prefix)
    return (kind, p) if p is not None else None


def parse_simple_line(line: str) -> Optional[Tuple[str, Point]]:
    m = INNER.search(line)
    if m:
        kind, stats = "train_inner", dict(INNER_PAIR.findall(m.group(1)))
    elif EPOCH.search(line):
        kind = "valid" if VALID.search(line) else "train_epoch"
        stats = dict(PIPE_PAIR.findall(line))
    else:
        return None
    p = point(stats)
    return (kind, p) if p is not None else None


def read_log(name: str, path: str) -> Run:
    run = Run(name)
    with open(generate_output.check_file(path, "--log"), encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            parsed = parse_json_line(line) if "{" in line else parse_simple_line(line)
            if parsed is not None:
                getattr(run, parsed[0]).append(parsed[1])
    if not run.train and not run.valid:
        raise ConfigError(f"--log {path}: no fairseq-train progress lines with num_updates "
                       "(expected --log-format simple or json output)")
    return run


def series(points: List[Point], metric: str) -> Tuple[List[float], List[float]]:
    xs = [p["num_updates"] for p in points if metric in p]
    return xs, [p[metric] for p in points if metric in p]


def smoothed(run: Run) -> bool:
    """Whether ``run``'s loss is label-smoothed: its log has an nll_loss beside the loss."""
    return any(NLL in p for p in run.train + run.valid)


def figure(runs: List[Run]):
    """Three panels: the loss without label smoothing (a label-smoothed run's nll_loss, so every run's
    line is the same quantity), perplexity and learning rate, each y axis labelled."""
    plt = report.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, run in enumerate(runs):
        color = colors[k % len(colors)]
        name = f"{run.name} (nll_loss: its loss is label-smoothed)" if smoothed(run) else run.name
        for ax, metric in zip(axes, (NLL if smoothed(run) else "loss", "ppl", "lr")):
            ax.plot(*series(run.train, metric), color=color, label=f"{name} train")
            if metric != "lr":
                ax.plot(*series(run.valid, metric), color=color, linestyle="--", marker="o",
                        markersize=3, label=f"{name} valid")
    titles = ("loss without label smoothing", "perplexity", "learning rate")
    ylabels = ("cross entropy (bits per token, base 2)", "perplexity (2 ** cross entropy, log scale)",
               "learning rate")
    for ax, title, ylabel in zip(axes, titles, ylabels):
        ax.set_title(title)
        ax.set_xlabel("updates")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot(runs: List[Run], path: str):
    report.save_figure(figure(runs), path)


def last(points: List[Point], metric: str) -> Optional[float]:
    values = [p[metric] for p in points if metric in p]
    return values[-1] if values else None


def table(runs: List[Run]) -> str:
    header = ["run", "updates", "train loss", "train ppl", "valid loss", "valid ppl", "best valid loss", "lr"]
    rows = []
    for r in runs:
        updates = max(p["num_updates"] for p in r.train + r.valid)
        valid_losses = [p["loss"] for p in r.valid if "loss" in p and not math.isnan(p["loss"])]
        lr = last(r.train, "lr")
        rows.append([r.name, str(int(updates)), report.fmt(last(r.train, "loss"), 3), report.fmt(last(r.train, "ppl")),
                     report.fmt(last(r.valid, "loss"), 3), report.fmt(last(r.valid, "ppl")),
                     report.fmt(min(valid_losses) if valid_losses else None, 3),
                     "-" if lr is None else f"{lr:.3g}"])
    return report.markdown_table(header, rows)


def run(args):
    runs = [read_log(*generate_output.split_name(spec)) for spec in args.log]
    text = table(runs)
    report.write_text(args.out + ".md", text)
    plot(runs, args.out + ".png")
    print(text, end="")
    print(f"wrote {args.out}.md and {args.out}.png")
