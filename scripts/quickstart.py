"""The quickstart: every model family of the suite on the embedded corpus, end to end.

generate data -> fairseq-preprocess -> fairseq-train --user-dir fairseq_plugins (each
family) -> average the last checkpoints -> fairseq-generate (beam 4) -> sacrebleu ->
a results table. Every step writes its output under --work and is skipped when that
output exists, so a re-run only does what is missing. Run it through
``bash scripts/quickstart.sh``, which creates the virtualenv first.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import sacrebleu

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from fairseq_plugins.cli._io import read_generate  # noqa: E402

USER_DIR = os.path.join(REPO, "fairseq_plugins")
BIN = os.path.dirname(sys.executable)

# Small, CPU-friendly recipes: the papers' optimisers need days, these need minutes.
ADAM = ["--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--clip-norm", "1.0"]
FAMILIES = {
    "vaswani_transformer_tiny": ["--share-all-embeddings", *ADAM, "--lr", "2e-3", "--lr-scheduler",
                                 "inverse_sqrt_warmup", "--warmup-updates", "200", "--criterion",
                                 "label_smoothed_xent", "--label-smoothing", "0.1", "--max-tokens", "4096"],
    "rnnsearch_tiny": [*ADAM, "--lr", "2e-3", "--criterion", "label_smoothed_xent", "--label-smoothing", "0",
                       "--max-tokens", "2048"],
    "rnnencdec_tiny": [*ADAM, "--lr", "2e-3", "--criterion", "label_smoothed_xent", "--label-smoothing", "0",
                       "--max-tokens", "2048"],
    "seq2seq_lstm_tiny": [*ADAM, "--lr", "2e-3", "--criterion", "label_smoothed_xent", "--label-smoothing", "0",
                          "--max-tokens", "2048"],
}


def say(message):
    print(f"[quickstart {time.strftime('%H:%M:%S')}] {message}", flush=True)


def run(cmd, log_path=None, echo=()):
    """Run a CLI; keep its output in ``log_path``; echo the lines that contain one of ``echo``."""
    env = dict(os.environ, PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    log = open(log_path, "w") if log_path else None
    proc = subprocess.Popen([str(c) for c in cmd], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    tail = []
    for line in proc.stdout:
        if log:
            log.write(line)
        tail = (tail + [line])[-20:]
        if any(marker in line for marker in echo):
            print("    " + line.rstrip().split(" | ", 2)[-1], flush=True)
    if log:
        log.close()
    if proc.wait() != 0:
        sys.exit(f"error: {cmd[0]} failed (exit {proc.returncode}); last lines:\n{''.join(tail)}")


def prepare_data(work, args):
    raw, data = os.path.join(work, "raw"), os.path.join(work, "data-bin")
    if not os.path.exists(os.path.join(raw, "test.tgt")):
        say("generating the embedded corpus")
        run([sys.executable, "-m", "fairseq_plugins.cli.make_corpus", "--out", raw, "--train", args.train,
             "--valid", 300, "--test", args.test, "--min-len", 5, "--max-len", args.max_len, "--seed", 1])
    if not os.path.exists(os.path.join(data, "test.src-tgt.tgt.idx")):
        say("fairseq-preprocess (joined dictionary)")
        run(["fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", f"{raw}/train",
             "--validpref", f"{raw}/valid", "--testpref", f"{raw}/test", "--destdir", data, "--joined-dictionary",
             "--workers", 2], os.path.join(work, "preprocess.log"))
    return data


def count_parameters(checkpoint):
    import torch

    from fairseq_plugins.compat import load_state

    seen, total = set(), 0
    for tensor in load_state(checkpoint)["model"].values():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tensor.shape)
        if key not in seen:  # tied embeddings are stored once
            seen.add(key)
            total += tensor.numel()
    del torch
    return total


def train_and_evaluate(work, data, arch, args):
    out = os.path.join(work, arch)
    result_path = os.path.join(out, "result.json")
    if os.path.exists(result_path):
        say(f"{arch}: done before, skipping (delete {out} to redo)")
        with open(result_path) as f:
            return json.load(f)
    os.makedirs(out, exist_ok=True)
    ckpt = os.path.join(out, "checkpoints")
    interval = max(1, args.max_update // 10)
    say(f"{arch}: fairseq-train, {args.max_update} updates (or {args.minutes:g} minutes)")
    start = time.time()
    run(["fairseq-train", data, "--user-dir", USER_DIR, "--arch", arch, *FAMILIES[arch], "--cpu",
         "--max-update", args.max_update, "--stop-time-hours", args.minutes / 60, "--save-dir", ckpt,
         "--save-interval-updates", interval, "--keep-interval-updates", 5, "--no-epoch-checkpoints",
         "--no-progress-bar", "--log-interval", max(1, args.max_update // 5), "--seed", 1, "--num-workers", 0],
        os.path.join(out, "train.log"), echo=(" | train_inner | ", " | valid | "))
    train_seconds = time.time() - start
    say(f"{arch}: averaging the last checkpoints")
    average = os.path.join(out, "average.pt")
    run([sys.executable, "-m", "fairseq_plugins.cli.average_checkpoints", "--inputs", ckpt,
         "--num-update-checkpoints", min(5, len([f for f in os.listdir(ckpt) if f.startswith("checkpoint_")])),
         "--output", average], os.path.join(out, "average.log"))
    say(f"{arch}: fairseq-generate, beam 4, test set")
    gen = os.path.join(out, "generate.txt")
    run(["fairseq-generate", data, "--user-dir", USER_DIR, "--path", average, "--gen-subset", "test", "--beam", 4,
         "--batch-size", 64, "--cpu", "--max-len-a", 1, "--max-len-b", 10], gen)
    entries = read_generate(gen)
    hyps = [e.output for e in entries]
    refs = [e.ref for e in entries]
    result = {
        "model": arch,
        "parameters": count_parameters(average),
        "train_minutes": round(train_seconds / 60, 1),
        "bleu": round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2),
        "chrf": round(sacrebleu.corpus_chrf(hyps, [refs]).score, 2),
        "sentences": len(entries),
    }
    with open(result_path, "w") as f:
        json.dump(result, f)
    return result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", default=os.path.join(REPO, "work", "quickstart"), help="where everything is written")
    p.add_argument("--models", nargs="+", default=list(FAMILIES), choices=list(FAMILIES), help="families to train")
    p.add_argument("--train", type=int, default=20000, help="training sentence pairs")
    p.add_argument("--test", type=int, default=500, help="test sentence pairs")
    p.add_argument("--max-len", type=int, default=20, help="longest sentence of the corpus")
    p.add_argument("--max-update", type=int, default=1500, help="updates per model")
    p.add_argument("--minutes", type=float, default=2.2, help="training time limit per model")
    args = p.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    data = prepare_data(args.work, args)
    results = [train_and_evaluate(args.work, data, arch, args) for arch in args.models]
    table = ["| model | parameters | training (min) | BLEU | chrF |", "|---|---:|---:|---:|---:|"]
    table += [f"| {r['model']} | {r['parameters']:,} | {r['train_minutes']} | {r['bleu']} | {r['chrf']} |"
              for r in results]
    with open(os.path.join(args.work, "results.md"), "w") as f:
        f.write("\n".join(table) + "\n")
    print("\n" + "\n".join(table))
    print(f"\n(test set: {results[0]['sentences']} sentences; outputs under {args.work})")


if __name__ == "__main__":
    main()
