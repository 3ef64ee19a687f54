"""Memory soak: fairseq-train with validation and checkpointing for a fixed time, RSS sampled.

    bash scripts/soak.sh [--minutes 30] [--arch vaswani_transformer_tiny] [--work work/soak]

One `fairseq-train --user-dir fairseq_plugins` run on the embedded corpus, validating and
writing checkpoints every ``--interval`` updates, epochs cycling, until ``--minutes`` pass
(fairseq's ``--stop-time-hours``). The trainer's resident memory (VmRSS) is read from /proc
every ``--sample-seconds``. Writes ``memory.csv``, ``memory.png`` and ``memory.md`` (table and
verdict: growth after the warm-up, compared with ``--tolerance``) under ``--work``.
Exit status 1 when memory grew more than the tolerance.
"""
import argparse
import csv
import os
import subprocess
import sys
import time

from fairseq_plugins.analysis.report import markdown_table
from fairseq_plugins_lab import experiment
from fairseq_plugins_lab.memory import count, last_update, rss_mib, verdict

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RECIPE = experiment.small_adam_recipe(lr=1e-3, max_tokens=2048, label_smoothing=0.1, warmup_updates=200)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", default=os.path.join(REPO, "work", "soak"), help="where everything is written")
    p.add_argument("--arch", default="vaswani_transformer_tiny", help="model to train (a registered arch)")
    p.add_argument("--minutes", type=float, default=30.0, help="training time")
    p.add_argument("--sample-seconds", type=float, default=60.0, help="seconds between memory samples")
    p.add_argument("--warmup-minutes", type=float, default=5.0, help="samples before this are not judged")
    p.add_argument("--interval", type=int, default=200, help="updates between validation + checkpoint")
    p.add_argument("--tolerance", type=float, default=0.05, help="largest allowed relative growth after warm-up")
    p.add_argument("--train", type=int, default=20000, help="training sentence pairs of the embedded corpus")
    args = p.parse_args(argv)

    os.makedirs(args.work, exist_ok=True)
    raw = experiment.make_corpus(os.path.join(args.work, "raw"), train=args.train, valid=300, test=20,
                                 min_len=5, max_len=30, seed=1)
    data = experiment.preprocess(raw, os.path.join(args.work, "data-bin"))
    log_path = os.path.join(args.work, "train.log")
    cmd = ["fairseq-train", data, "--user-dir", experiment.USER_DIR, "--arch", args.arch, *RECIPE, "--cpu",
           "--stop-time-hours", str(args.minutes / 60), "--save-dir", os.path.join(args.work, "checkpoints"),
           "--save-interval-updates", str(args.interval), "--validate-interval-updates", str(args.interval),
           "--keep-interval-updates", "2", "--no-epoch-checkpoints", "--no-progress-bar", "--log-interval", "100",
           "--seed", "1", "--num-workers", "0", "--max-epoch", "100000"]
    experiment.say(f"{args.arch}: fairseq-train for {args.minutes:g} minutes, RSS every {args.sample_seconds:g} s")
    env = dict(os.environ, PATH=experiment.BIN + os.pathsep + os.environ.get("PATH", ""))
    samples = []
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        start = time.time()
        while proc.poll() is None:
            try:
                samples.append(((time.time() - start) / 60, rss_mib(proc.pid)))
            except (OSError, RuntimeError):  # the process ended between poll() and the read
                break
            experiment.say(f"minute {samples[-1][0]:5.1f}: RSS {samples[-1][1]:7.1f} MiB")
            deadline = time.time() + args.sample_seconds
            while proc.poll() is None and time.time() < deadline:
                time.sleep(0.5)
    if proc.wait() != 0:
        sys.exit(f"error: fairseq-train failed (exit {proc.returncode}); see {log_path}")

    with open(os.path.join(args.work, "memory.csv"), "w", newline="") as f:
        csv.writer(f).writerows([("minute", "rss_mib"), *((f"{t:.2f}", f"{m:.3f}") for t, m in samples)])
    result = verdict(samples, args.warmup_minutes, args.tolerance)
    updates = last_update(log_path)
    validations = count(log_path, r" \| valid on ")
    saves = count(log_path, r"Saved checkpoint ")
    epochs = count(log_path, r"end of epoch \d+")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot([t for t, _ in samples], [m for _, m in samples], marker="o")
    ax.axvline(args.warmup_minutes, color="grey", linestyle="--", label="end of warm-up")
    ax.set(xlabel="minutes", ylabel="resident memory (MiB)", title=f"{args.arch}: training + validation + checkpoints")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.work, "memory.png"), dpi=100)

    verdict_line = (f"**RSS grew {result['growth']:+.1%} after the {args.warmup_minutes:g}-minute warm-up** "
                    f"({result['start_mib']:.0f} → {result['end_mib']:.0f} MiB, medians of the first and last 3 "
                    f"samples; slope {result['slope_mib_per_hour']:+.1f} MiB/hour; peak {result['peak_mib']:.0f} "
                    f"MiB): {'MORE' if result['grew'] else 'not more'} than the {args.tolerance:.0%} tolerance.")
    lines = [f"# Memory soak: {args.arch}, {args.minutes:g} minutes", "",
             f"Command: `bash scripts/soak.sh --minutes {args.minutes:g} --arch {args.arch}`", "",
             f"Over the run: {updates} updates, {epochs} epochs ended, {validations} validations, "
             f"{saves} checkpoints saved.", "", verdict_line, "", "![memory](memory.png)", "",
             *markdown_table(["minute", "RSS (MiB)"], [(f"{t:.1f}", f"{m:.1f}") for t, m in samples]).splitlines()]
    with open(os.path.join(args.work, "memory.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n" + verdict_line)
    return 1 if result["grew"] else 0


if __name__ == "__main__":
    sys.exit(main())
