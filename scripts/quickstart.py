"""The quickstart: every model family of the suite on the embedded corpus, end to end.

generate data -> fairseq-preprocess -> fairseq-train --user-dir fairseq_plugins (each
family) -> average the last 5 checkpoints -> fairseq-generate (beam 4) -> sacrebleu ->
a results table. Every step is skipped when its output exists under --work, so a re-run
only does what is missing. Run it through ``bash scripts/quickstart.sh``.
"""
import argparse
import os

from fairseq_plugins import experiment

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Small, CPU-friendly recipes: the papers' optimisers need days, these need minutes. RNNs get
# a higher learning rate; RNNsearch/RNNencdec start from their default, PyTorch's
# initialisation (the paper's N(0, 0.01^2) learns far slower with Adam: docs/DEFAULTS.md).
RNN = experiment.small_adam_recipe(lr=5e-3, max_tokens=2048)
FAMILIES = {
    "vaswani_transformer_tiny": ["--share-all-embeddings", *experiment.small_adam_recipe(
        lr=2e-3, max_tokens=4096, label_smoothing=0.1, warmup_updates=200)],
    "rnnsearch_tiny": RNN,
    "rnnencdec_tiny": RNN,
    "seq2seq_lstm_tiny": RNN,
}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", default=os.path.join(REPO, "work", "quickstart"), help="where everything is written")
    p.add_argument("--models", nargs="+", default=list(FAMILIES), choices=list(FAMILIES), help="families to train")
    p.add_argument("--train", type=int, default=20000, help="training sentence pairs")
    p.add_argument("--test", type=int, default=500, help="test sentence pairs")
    p.add_argument("--max-len", type=int, default=20, help="longest sentence of the corpus")
    # The budget is in updates, so that the table is the same on every CPU; the time is only reported.
    p.add_argument("--max-update", type=int, default=800, help="updates per model")
    p.add_argument("--minutes", type=float, default=30.0,
                   help="training time limit per model, a safety net: the table should not depend on the CPU's speed")
    args = p.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    raw = experiment.make_corpus(os.path.join(args.work, "raw"), train=args.train, valid=300, test=args.test,
                                 min_len=5, max_len=args.max_len, seed=1)
    data = experiment.preprocess(raw, os.path.join(args.work, "data-bin"))
    results = [experiment.train_and_evaluate(args.work, arch, data, ["--arch", arch, *FAMILIES[arch]],
                                             args.max_update, args.minutes, validate_last_only=True)
               for arch in args.models]
    table = ["| model | parameters | updates | training (min) | BLEU | chrF |", "|---|---:|---:|---:|---:|---:|"]
    table += [f"| {r['model']} | {r['parameters']:,} | {r['updates']:,} | {r['train_minutes']} | {r['bleu']} | "
              f"{r['chrf']} |" for r in results]
    notes = [f"{r['model']} stopped on the {args.minutes:g}-minute time limit at update {r['updates']} of "
             f"{r['max_update']}: its row is not comparable to a finished run's"
             for r in results if r.get("stopped_on_time")]
    with open(os.path.join(args.work, "results.md"), "w") as f:
        f.write("\n".join(table + [""] + notes) + "\n")
    print("\n" + "\n".join(table))
    print(f"\n(test set: {results[0]['sentences']} sentences, beam 4; each model scored with the average of its "
          f"last 5 checkpoints, written every 1/30 of its updates; outputs under {args.work})")
    for note in notes:
        print("warning: " + note)


if __name__ == "__main__":
    main()
