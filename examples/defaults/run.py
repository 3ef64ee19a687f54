"""Issue 18's measurement: which initialisation should RNNsearch/RNNencdec default to?

    python examples/defaults/run.py --work WORK --data NAME=DATA_BIN[:SRC-TGT[:bpe]] ... \
        [--runs NAME,...] [--max-update 300]

Trains each run (a model x init x recipe, below) for the same number of updates on each
corpus, validates every --valid-every updates, translates the test set with beam 4 and
fairseq-generate's default length limit (200 tokens: what a user gets), and writes
WORK/<corpus>/<run>/{train.log,generate.txt,result.json}. Re-running skips finished runs. ``--report PREFIX`` writes the table and the curves.
"""
import argparse
import json
import os
import subprocess
import re
import sys

import sacrebleu

import fairseq_plugins

from fairseq_plugins.analysis.generate_output import read_generate

USER_DIR = os.path.dirname(os.path.abspath(fairseq_plugins.__file__))

# --sizes tiny: the _tiny archs (embeddings 32, GRUs 64, alignment 64, maxout 32) and fairseq's
# lstm at the same sizes. --sizes issue: issue 18's (embeddings 256, encoder 256 per direction,
# decoder 512, alignment 512, maxout 256). seq2seq and transformer: their _tiny archs' defaults.
SIZES = {
    "tiny": dict(emb=32, enc=64, dec=64, att=64, maxout=32),
    "issue": dict(emb=256, enc=256, dec=512, att=512, maxout=256),
}


def model_flags(model, sizes):
    z = SIZES[sizes]
    rnn = ["--encoder-embed-dim", z["emb"], "--encoder-hidden-size", z["enc"], "--decoder-embed-dim", z["emb"],
           "--decoder-hidden-size", z["dec"]]
    flags = {
        "lstm": ["--arch", "lstm", *rnn, "--encoder-bidirectional", "--decoder-out-embed-dim", z["maxout"]],
        "rnnsearch": ["--arch", "rnnsearch", *rnn, "--attention-hidden-size", z["att"], "--maxout-dim", z["maxout"]],
        "rnnencdec": ["--arch", "rnnencdec", *rnn, "--maxout-dim", z["maxout"]],
        "seq2seq": ["--arch", "seq2seq_lstm_tiny"],
        "transformer": ["--arch", "vaswani_transformer_tiny"],
    }[model]
    return [str(x) for x in flags]


RECIPES = {  # the README's Adam recipe (as in the issue) and Bahdanau et al.'s appendix B.2
    "adam": ["--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt",
             "--warmup-updates", "300", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
             "--max-tokens", "4096"],
    "adadelta": ["--optimizer", "adadelta", "--lr", "1.0", "--adadelta-rho", "0.95", "--adadelta-eps", "1e-6",
                 "--batch-size", "80", "--clip-norm", "1", "--sentence-avg", "--criterion", "cross_entropy"],
}


def run_flags(name, sizes):
    """'rnnsearch-paper-adam' -> fairseq-train flags; 'lstm-adam' has no --init (nor has a default run)."""
    parts = name.split("-")
    model, recipe = parts[0], parts[-1]
    init = ["--init", parts[1]] if len(parts) == 3 else []
    return [*model_flags(model, sizes), *init, *RECIPES[recipe]]


def call(cmd, log):
    with open(log, "w") as f:
        if subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT) != 0:
            sys.exit(f"error: {cmd[0]} failed, see {log}")


def detokenize(lines, lang):
    from sacremoses import MosesDetokenizer

    md = MosesDetokenizer(lang=lang)
    return [md.detokenize(line.split()) for line in lines]


def train_minutes(log):
    """fairseq-train's own wall clock at its last logged line (``wall=`` / ``| wall N``)."""
    walls = re.findall(r"wall[= ](\d+)", open(log).read())
    return round(int(walls[-1]) / 60, 1) if walls else None


def train_and_score(work, corpus, data, pair, bpe, name, max_update, valid_every, sizes):
    out = os.path.join(work, corpus, name)
    if os.path.exists(os.path.join(out, "result.json")):
        return
    os.makedirs(out, exist_ok=True)
    src, tgt = pair.split("-")
    common = ["--user-dir", USER_DIR, "--cpu", "--source-lang", src, "--target-lang", tgt]
    log = os.path.join(out, "train.log")
    trained = os.path.exists(log) and "done training" in open(log).read()
    if not trained:  # a finished training is kept (an interrupted driver resumes at generation)
        call(["fairseq-train", data, *common, *run_flags(name, sizes), "--max-update", str(max_update), "--seed", "1",
              "--save-dir", os.path.join(out, "ckpt"), "--no-epoch-checkpoints", "--no-save-optimizer-state",
              "--validate-interval-updates", str(valid_every), "--log-interval", "10", "--log-format", "simple",
              "--no-progress-bar", "--num-workers", "0"], log)
    minutes = train_minutes(log)
    gen = os.path.join(out, "generate.txt")
    call(["fairseq-generate", data, *common, "--path", os.path.join(out, "ckpt", "checkpoint_last.pt"),
          "--gen-subset", "test", "--beam", "4", "--batch-size", "64", *(["--remove-bpe"] if bpe else [])], gen)
    entries = read_generate(gen)
    hyps, refs = [e.output for e in entries], [e.ref for e in entries]
    if bpe:
        hyps, refs = detokenize(hyps, tgt), detokenize(refs, tgt)
    hyp_len, ref_len = sum(len(e.output.split()) for e in entries), sum(len(e.ref.split()) for e in entries)
    result = {"run": name, "corpus": corpus, "updates": max_update, "train_minutes": minutes,
              "bleu": round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2),
              "chrf": round(sacrebleu.corpus_chrf(hyps, [refs]).score, 1),
              "length_ratio": round(hyp_len / ref_len, 2), "sentences": len(entries),
              "max_len_warning": "stopped at the maximum length" in open(gen).read()}
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(result, f)
    print(json.dumps(result), flush=True)


def valid_losses(log):
    """{updates: validation loss (base 2)} from a fairseq-train log."""
    found = re.findall(r"valid on 'valid' subset \| loss ([\d.]+) .*?\| num_updates (\d+)", open(log).read())
    return {int(n): float(loss) for loss, n in found}


def report(work, out):
    """OUT.md (one row per finished run) and OUT.png (fairseq-plugins-plot-curves of every run)."""
    rows, logs, found = [], [], []
    for corpus in sorted(os.listdir(work)):
        for name in sorted(os.listdir(os.path.join(work, corpus))):
            folder = os.path.join(work, corpus, name)
            if not os.path.exists(os.path.join(folder, "result.json")):
                continue
            with open(os.path.join(folder, "result.json")) as f:
                r = json.load(f)
            found.append((corpus, name, r, valid_losses(os.path.join(folder, "train.log"))))
            logs.append(f"--log={corpus}/{name}={os.path.join(folder, 'train.log')}")
    points = sorted(set().union(*(valid for *_, valid in found)))
    for corpus, name, r, valid in found:
        rows.append(f"| {corpus} | {name} | {r['updates']} | {r['train_minutes']} | "
                    + " | ".join(str(valid.get(n, "")) for n in points)
                    + f" | {r['bleu']} | {r['chrf']} | {r['length_ratio']} | {'yes' if r['max_len_warning'] else 'no'} |")
    call([sys.executable, "-m", "fairseq_plugins.cli.plot_curves", *logs, "--out", out], out + ".plot.log")
    table = ["| corpus | run | updates | training (min) | " + " | ".join(f"valid loss @{n}" for n in points)
             + " | BLEU | chrF | hyp/ref length | max-length warning |",
             "|---|---|---:|---:|" + "---:|" * len(points) + "---:|---:|---:|---|", *rows]
    with open(out + ".md", "w") as f:
        f.write("\n".join(table) + "\n")
    print("\n".join(table))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", required=True)
    p.add_argument("--data", action="append", default=[], help="NAME=DATA_BIN:SRC-TGT[:bpe]")
    p.add_argument("--runs", default="", help="comma-separated, e.g. lstm-adam,rnnsearch-pytorch-adam")
    p.add_argument("--report", metavar="PREFIX", help="write PREFIX.md and PREFIX.png from the finished runs")
    p.add_argument("--max-update", type=int, default=300)
    p.add_argument("--valid-every", type=int, default=100)
    p.add_argument("--sizes", choices=sorted(SIZES), default="tiny", help="model sizes (see SIZES)")
    args = p.parse_args(argv)
    if args.report:
        return report(args.work, args.report)
    for spec in args.data:
        corpus, rest = spec.split("=", 1)
        data, pair, *bpe = rest.split(":")
        for name in args.runs.split(","):
            train_and_score(args.work, corpus, data, pair, bool(bpe), name, args.max_update, args.valid_every,
                            args.sizes)


if __name__ == "__main__":
    main()
