"""Training throughput on CPU: processes × precision × model, in one run (``fairseq-plugins-benchmark-scale``).

Eight ``fairseq-train`` cells on the same data and flags (``fairseq-plugins-benchmark``'s presets,
corpus and training flags, criterion ``label_smoothed_xent``):

* model: the suite's ``vaswani_transformer`` and fairseq's ``transformer`` of identical size;
* precision: fp32, and bf16 through the criterion's ``--autocast-bf16`` (both models);
* layout: 1 process × N threads with ``--update-freq N``, and N processes × 1 thread started by
  ``fairseq-train --distributed-world-size N --cpu`` (fairseq's spawn, gloo). Both make the same updates from the same batches
  (``--max-tokens`` is per process; see docs/SCALE.md).

Each cell's figure is fairseq's own logged speed: target words over seconds of the updates
after the warm-up ones (per update, ``wpb`` words in ``wpb / wps`` seconds, as logged with
``--log-interval 1``; rank 0 logs the sum over processes). Repeats interleave the cells,
reversing their order every other repeat; the table gives medians, and the ratios are medians
over repeats of the ratio within a repeat (cells measured minutes apart share less of the
machine's drifting load). ``--budget-minutes`` bounds the run as in fairseq-plugins-benchmark:
the first cell stops at its share of the time and fixes the updates of all later ones.
"""
import collections
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from fairseq_plugins.analysis.report import markdown_table
from fairseq_plugins.errors import PluginError
from fairseq_plugins_lab.benchmarks.harness import Budget, log
from fairseq_plugins_lab.benchmarks.presets import (
    MODELS,
    PRESETS,
    _dictionaries,
    _same_file,
    pair_flags,
    prepare_data,
    training_argv,
)
from fairseq_plugins_lab.benchmarks.report import PAIR_LABELS, describe_run

FAIRSEQ_TRAIN = shutil.which("fairseq-train", path=os.path.dirname(sys.executable)) or "fairseq-train"
PRECISIONS = ("fp32", "bf16")
LAYOUTS = ("1 process", "N processes")
# ours and the built-in run next to each other, as in fairseq-plugins-benchmark
CELLS = [(model, precision, layout) for precision in PRECISIONS for layout in LAYOUTS for model in MODELS]
DEFAULT_BUDGET_MINUTES = 15  # cpu preset, 3 repeats: about 12 timed updates per run on 2 cores (estimated)
BUDGET_MINUTES = {"tiny": 2}
HANG_SECONDS = 300  # a run still going this long after its deadline is stopped as hung


def _command(args, cell, argv):
    """The command line and environment of one cell."""
    _, precision, layout = cell
    argv = argv + (["--autocast-bf16"] if precision == "bf16" else [])
    env = dict(os.environ)
    if layout == "1 process":
        env["OMP_NUM_THREADS"] = str(args.processes)
        return [FAIRSEQ_TRAIN, *argv, "--update-freq", str(args.processes)], env
    env["OMP_NUM_THREADS"] = "1"
    # fairseq's spawn on CPU (patches/launch.py, cpu_launch): rank 0 logs the training lines
    return [FAIRSEQ_TRAIN, *argv, "--distributed-world-size", str(args.processes)], env


def train_run(args, cell, argv, updates: int, deadline: float) -> dict:
    """One cell: fairseq-train until warm-up + ``updates`` updates, or until the deadline once
    at least one update is timed. Returns the timed updates and their target words/s."""
    cmd, env = _command(args, cell, argv + ["--max-update", str(args.warmup + updates)])
    # own process group: stopping the run stops every spawned worker
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    watchdog = threading.Timer(max(deadline - time.time(), 0) + HANG_SECONDS, os.killpg, (proc.pid, signal.SIGKILL))
    watchdog.start()
    tail = collections.deque(maxlen=20)
    words = seconds = 0.0
    timed, stopped = 0, False
    try:
        for line in proc.stdout:
            tail.append(line)
            if "| train_inner |" not in line:
                continue
            stats = json.loads(line.split("| train_inner |", 1)[1])
            if int(stats["num_updates"]) <= args.warmup:
                continue
            words += float(stats["wpb"])
            seconds += float(stats["wpb"]) / float(stats["wps"])
            timed += 1
            if timed < updates and time.time() > deadline:
                stopped = True
                os.killpg(proc.pid, signal.SIGTERM)
                break
    except BaseException:  # Ctrl-C or a bad log line: leave no worker behind
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    finally:
        proc.stdout.close()
        proc.wait()
        watchdog.cancel()
    if not stopped and (proc.returncode != 0 or timed == 0):
        raise PluginError(f"{' '.join(cmd[:3])} ... exited {proc.returncode} after {timed} timed updates:\n"
                          + "".join(tail))
    return {"updates": timed, "words_per_s": words / seconds}


def run(args) -> str:
    start = time.time()
    args.load_at_start = os.getloadavg()[0]
    budget = Budget(args.budget_minutes, len(CELLS) * args.repeats)  # making the corpus counts too
    work_dir = tempfile.mkdtemp(prefix="fairseq-plugins-benchmark-scale-")
    try:
        preset = PRESETS[args.preset]
        if args.data is None:
            log("making the synthetic corpus")
            args.data = prepare_data(args, preset, work_dir)
        flags = pair_flags("transformer", preset, _same_file(*_dictionaries(args.data, args, need_test=False)))
        # benchmark's flags (--no-save: no checkpoint writes in the timing; one log line per update)
        argv = {model: training_argv(args, flags[model], work_dir, criterion="label_smoothed_xent")
                + ["--no-save", "--log-format", "json", "--log-interval", "1"] for model in MODELS}
        results = {cell: [] for cell in CELLS}
        updates = None  # fixed by the first run
        for repeat in range(args.repeats):
            for cell in CELLS if repeat % 2 == 0 else CELLS[::-1]:
                began = time.time()
                deadline = budget.deadline()
                result = train_run(args, cell, argv[cell[0]], updates or args.updates, deadline)
                updates = updates or result["updates"]
                results[cell].append(result)
                log(f"repeat {repeat + 1}/{args.repeats}: {_label(args, cell)}: {result['words_per_s']:,.0f} "
                    f"target words/s over {result['updates']} updates ({time.time() - began:.0f} s in all)")
        return format_report(args, preset, results, updates, time.time() - start)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


def _label(args, cell) -> str:
    model, precision, layout = cell
    return f"{PAIR_LABELS['transformer'][MODELS.index(model)]} {precision} {_layout(args, layout)}"


def _layout(args, layout: str) -> str:
    n = args.processes
    return (f"1 process × {n} threads (--update-freq {n})" if layout == "1 process"
            else f"{n} processes × 1 thread (gloo)")


def _ratio(results, numerator, denominator) -> float:
    """Median over repeats of the ratio within each repeat."""
    return statistics.median(a["words_per_s"] / b["words_per_s"]
                             for a, b in zip(results[numerator], results[denominator]))


def format_report(args, preset: dict, results, updates: int, seconds: float) -> str:
    n = args.processes
    names = dict(zip(MODELS, PAIR_LABELS["transformer"]))
    speed_rows = []
    for model in MODELS:
        for precision in PRECISIONS:
            one, many = (model, precision, "1 process"), (model, precision, "N processes")
            medians = [statistics.median(r["words_per_s"] for r in results[cell]) for cell in (one, many)]
            speed_rows.append([names[model] + (" (fairseq built-in)" if model == "theirs" else ""), precision,
                               *(f"{m:,.0f}" for m in medians), f"{_ratio(results, many, one):.2f}×"])
    ratio_rows = [[f"ours / built-in, {precision}",
                   *(f"{_ratio(results, ('ours', precision, l), ('theirs', precision, l)):.2f}×" for l in LAYOUTS)]
                  for precision in PRECISIONS]
    ratio_rows += [[f"bf16 / fp32, {names[model]}",
                    *(f"{_ratio(results, (model, 'bf16', l), (model, 'fp32', l)):.2f}×" for l in LAYOUTS)]
                   for model in MODELS]
    layouts = [_layout(args, layout) for layout in LAYOUTS]
    details = [f"- {_label(args, cell)}: " + ", ".join(f"{r['words_per_s']:,.0f} ({r['updates']} updates)"
                                                       for r in results[cell]) for cell in CELLS]
    sizes = (f"{preset['layers']}+{preset['layers']} layers, d_model {preset['d_model']}, d_ff {preset['d_ff']}, "
             f"{preset['heads']} heads")
    report = [
        "# fairseq-plugins scale benchmark: training throughput on CPU",
        "",
        *describe_run(args, seconds),
        f"- settings: preset {args.preset} ({sizes}), data {args.data_label}, criterion label_smoothed_xent "
        f"(bf16: --autocast-bf16), --max-tokens {args.max_tokens} per process, {n} processes against 1 process "
        f"with --update-freq {n} (the same updates), {args.warmup} warm-up + {updates} timed updates per run "
        f"(fewer where the budget ran out), repeats: {args.repeats}, interleaved",
        "- figures: target words/s from fairseq's log (Σ wpb / Σ wpb/wps over the timed updates), medians over "
        "repeats; ratios: medians over repeats of the ratio within a repeat",
        "",
        *markdown_table(["model", "precision", *layouts, f"{n} processes / 1 process"], speed_rows).splitlines(),
        "",
        *markdown_table(["ratio", *layouts], ratio_rows).splitlines(),
        "",
        "Per repeat (target words/s):",
        "",
        *details,
        "",
    ]
    return "\n".join(report)
