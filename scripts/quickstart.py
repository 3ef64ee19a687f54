"""The quickstart: every model family of the suite on the embedded corpus, end to end.

generate data -> fairseq-preprocess -> fairseq-train --user-dir fairseq_plugins (each
family, two at a time) -> average the last 5 checkpoints -> fairseq-generate (beam 4) ->
sacrebleu -> a results table and BLEU by source length (Bahdanau et al.'s Fig. 2, one line
per model). Every step is skipped when its output exists under --work, so a re-run only does
what is missing. Run it through ``bash scripts/quickstart.sh``.
"""
import argparse
import os
import re
import threading

from fairseq_plugins.analysis import generate_output
from fairseq_plugins.analysis.bleu_by_length import bucket_labels, scores_by_bucket
from fairseq_plugins_lab import experiment

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Small, CPU-friendly recipes: the papers' optimisers need days, these need minutes. RNNs get
# a higher learning rate; RNNsearch/RNNencdec start from their default, PyTorch's
# initialisation (the paper's N(0, 0.01^2) learns far slower with Adam: docs/DEFAULTS.md).
# Each family has its own update budget (measured: docs/RESULTS.md, Quickstart): the attention
# models translate the corpus almost perfectly in a few hundred updates, the two with one fixed
# source vector need several times more to learn visibly. The LSTM, whose decoder sees the source
# only through its initial state, gets twice the learning rate: 0.3-0.5 bits lower training loss
# at equal updates, at no cost per update (docs/DEFAULTS.md, seq2seq_lstm_tiny in the quickstart).
RNN = experiment.small_adam_recipe(lr=5e-3, max_tokens=2048)
FAMILIES = {  # arch: (fairseq-train flags, updates)
    "vaswani_transformer_tiny": (["--share-all-embeddings", *experiment.small_adam_recipe(
        lr=2e-3, max_tokens=4096, label_smoothing=0.1, warmup_updates=200)], 400),
    "rnnsearch_tiny": (RNN, 400),
    "rnnencdec_tiny": (RNN, 2000),
    "seq2seq_lstm_tiny": (experiment.small_adam_recipe(lr=1e-2, max_tokens=2048), 3000),
}
# BLEU every family passes on its budget: about half of what it reached on two CPUs (docs/RESULTS.md,
# Quickstart), far above an untrained model's ~0. Below it the quickstart fails: a family did not learn.
FLOORS = {"vaswani_transformer_tiny": 40.0, "rnnsearch_tiny": 50.0, "rnnencdec_tiny": 8.0, "seq2seq_lstm_tiny": 3.0}
ORDER = sorted(FAMILIES, key=lambda arch: -FAMILIES[arch][1])  # the longest first: the workers end together
MIN_LEN = 5  # the grammar's shortest sentence


def bleu_by_length(generate_txt, edges):
    """BLEU of the translations in ``generate_txt`` (fairseq-generate's output) by source length."""
    gens = generate_output.read_generate(generate_txt)
    system = generate_output.System(generate_txt, generate_txt, [g.output for g in gens], [g.ref for g in gens],
                                    [g.src for g in gens])
    return [bleu for _, bleu, _ in scores_by_bucket(system, edges, "13a")]


def updates_logged(train_log):
    """The last num_updates fairseq-train logged to ``train_log`` (0 before its first line)."""
    try:
        with open(train_log) as f:
            found = re.findall(r"num_updates[= ](\d+)", f.read())
    except FileNotFoundError:
        return 0
    return int(found[-1]) if found else 0


def with_progress(work, budgets, seconds, train):
    """``train()``, with one line every ``seconds`` (when it changed) of each model's updates so far,
    read from its train.log: fairseq's own lines count each epoch, not the whole budget."""
    stop = threading.Event()

    def report():
        last = None
        while not stop.wait(seconds):
            line = "training, updates done: " + ", ".join(
                f"{arch} {updates_logged(os.path.join(work, arch, 'train.log')):,}/{total:,}"
                for arch, total in budgets.items())
            if line != last:
                experiment.say(line)
                last = line
    thread = threading.Thread(target=report, daemon=True)
    thread.start()
    try:
        return train()
    finally:
        stop.set()
        thread.join()


def not_learned(results, max_update):
    """One line per model below its floor, of the runs that trained their whole default budget."""
    return [f"{r['model']}: BLEU {r['bleu']} after {r['updates']:,} updates, below the {FLOORS[r['model']]:g} every "
            "run of the quickstart has passed: it did not learn" for r in results
            if max_update is None and not r.get("stopped_on_time") and float(r["bleu"]) < FLOORS[r["model"]]]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", default=os.path.join(REPO, "work", "quickstart"), help="where everything is written")
    p.add_argument("--models", nargs="+", default=ORDER, choices=ORDER, help="families to train")
    p.add_argument("--train", type=int, default=20000, help="training sentence pairs")
    p.add_argument("--test", type=int, default=500, help="test sentence pairs")
    p.add_argument("--max-len", type=int, default=20, help="longest sentence of the corpus")
    # The budget is in updates, so that the table is the same on every CPU; the time is only reported.
    p.add_argument("--max-update", type=int,
                   help="updates of every model (default: each family's own, "
                        + ", ".join(f"{arch} {updates}" for arch, (_, updates) in FAMILIES.items()) + ")")
    p.add_argument("--minutes", type=float, default=30.0,
                   help="training time limit per model, a safety net: the table should not depend on the CPU's speed")
    p.add_argument("--jobs", type=int, default=2, help="trainings at a time, one thread each")
    p.add_argument("--progress-seconds", type=float, default=30.0,
                   help="how often the line of every model's updates so far is printed")
    args = p.parse_args(argv)
    for flag, value in (("--jobs", args.jobs), ("--max-update", args.max_update)):
        if value is not None and value < 1:
            p.error(f"{flag} {value}: need at least 1")
    # One thread per training, --jobs of them share the cores (as examples/paper_claims does).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.makedirs(args.work, exist_ok=True)
    raw = experiment.make_corpus(os.path.join(args.work, "raw"), train=args.train, valid=300, test=args.test,
                                 min_len=MIN_LEN, max_len=args.max_len, seed=1)
    data = experiment.preprocess(raw, os.path.join(args.work, "data-bin"))

    budgets = {arch: FAMILIES[arch][1] if args.max_update is None else args.max_update for arch in args.models}

    def task(arch):
        return lambda: experiment.train_and_evaluate(args.work, arch, data, ["--arch", arch, *FAMILIES[arch][0]],
                                                     budgets[arch], args.minutes, validate_last_only=True, echo=False)

    trained = with_progress(args.work, budgets, args.progress_seconds,
                            lambda: experiment.run_parallel([task(arch) for arch in args.models], args.jobs))
    by_model = dict(zip(args.models, trained))
    results = [by_model[arch] for arch in FAMILIES if arch in by_model]  # the table in the families' order
    table = ["| model | parameters | updates | training (min) | BLEU | chrF |", "|---|---:|---:|---:|---:|---:|"]
    table += [f"| {r['model']} | {r['parameters']:,} | {r['updates']:,} | {r['train_minutes']} | {r['bleu']} | "
              f"{r['chrf']} |" for r in results]
    # thirds of the corpus's source lengths (5-9, 10-14, 15-20 words by default)
    step = max(1, (args.max_len - MIN_LEN + 1) // 3)
    edges = sorted({min(MIN_LEN + i * step, args.max_len) for i in range(3)})
    labels = bucket_labels(edges, args.max_len)  # inclusive, in words, as fairseq-plugins-bleu-by-length's own
    width = max(len(r["model"]) for r in results)
    by_length = ["BLEU by source length (words): " + ", ".join(labels)]
    by_length += [f"  {r['model']:<{width}}  " + "  ".join(
        "    -" if bleu is None else f"{bleu:5.1f}"
        for bleu in bleu_by_length(os.path.join(args.work, r["model"], "generate.txt"), edges)) for r in results]
    notes = [f"{r['model']} stopped on the {args.minutes:g}-minute time limit at update {r['updates']} of "
             f"{r['max_update']}: its row is not comparable to a finished run's"
             for r in results if r.get("stopped_on_time")]
    with open(os.path.join(args.work, "results.md"), "w") as f:
        f.write("\n".join(table + [""] + by_length + [""] + notes) + "\n")
    print("\n" + "\n".join(table))
    print("\n" + "\n".join(by_length))
    print(f"\n(test set: {results[0]['sentences']} sentences, beam 4; each model scored with the average of its "
          f"last 5 checkpoints, written every 1/30 of its updates; outputs under {args.work})")
    print("The papers' claims on longer sentences, several seeds and a real language pair: "
          "bash examples/paper_claims/run.sh (reports/paper_claims/REPORT.md).")
    for note in notes:
        print("warning: " + note)
    failures = not_learned(results, args.max_update)
    for failure in failures:
        print("error: " + failure)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
