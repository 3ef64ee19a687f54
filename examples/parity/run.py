"""Training parity on real language: the suite's models against fairseq's built-ins, same flags,
same budget, several seeds (issue: "trains as well as fairseq's own").

    python examples/parity/run.py --data DATA_BIN --source-lang en --target-lang fr --work WORK \
        [--size small|cpu|base] [--updates 500] [--seeds 1 2 3] [--runs transformer,vaswani_transformer,...] \
        [--jobs 2] [--threads 1] [--device cpu|cuda]

Each run is fairseq-train with --user-dir fairseq_plugins for exactly --updates updates, then
fairseq-generate (beam 4, BPE removed, Moses-detokenized) on the test set of the last
checkpoint, scored by sacrebleu (BLEU, chrF). WORK/<run>-seed<N>/result.json keeps each run
(re-running skips it); WORK/parity.md gets the table: mean ± sample standard deviation over the
seeds, and the median training words per second fairseq-train logged. examples/parity/run.sh
builds the catalog corpus and calls this.
"""
import argparse
import json
import os
import re
import statistics
import sys

from fairseq_plugins_lab.experiment import run_parallel, say, train_and_evaluate

# Transformer: layers per side, d_model, d_ff, heads. RNN: embedding, encoder hidden per
# direction, decoder hidden, attention hidden n', maxout l (lstm's decoder-out-embed-dim).
SIZES = {
    "tiny": dict(layers=1, d_model=16, d_ff=32, heads=2, embed=16, enc=16, dec=16, att=16, maxout=8),  # smoke runs
    "small": dict(layers=3, d_model=128, d_ff=512, heads=4, embed=128, enc=128, dec=256, att=256, maxout=128),
    "cpu": dict(layers=3, d_model=256, d_ff=1024, heads=4, embed=256, enc=256, dec=512, att=512, maxout=256),
    "base": dict(layers=6, d_model=512, d_ff=2048, heads=8, embed=620, enc=1000, dec=1000, att=1000, maxout=500),
}

# The recipe both sides of a pair get (fairseq's own Transformer recipe, scaled to a short budget).
RECIPE = ["--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt",
          "--warmup-updates", "100", "--warmup-init-lr", "1e-7", "--criterion", "label_smoothed_cross_entropy",
          "--label-smoothing", "0.1", "--dropout", "0.1", "--max-tokens", "1024"]


def transformer(arch, z, *extra):
    sizes = []
    for side in ("encoder", "decoder"):
        sizes += [f"--{side}-layers", z["layers"], f"--{side}-embed-dim", z["d_model"],
                  f"--{side}-ffn-embed-dim", z["d_ff"], f"--{side}-attention-heads", z["heads"]]
    return ["--arch", arch, *sizes, "--share-all-embeddings", *extra]


def rnn(z):
    return ["--encoder-embed-dim", z["embed"], "--decoder-embed-dim", z["embed"], "--encoder-hidden-size", z["enc"],
            "--decoder-hidden-size", z["dec"], "--encoder-layers", 1, "--decoder-layers", 1]


RUNS = {  # name -> model flags at sizes z; every size flag is given to both sides of a pair
    "transformer": lambda z: transformer("transformer", z),
    "vaswani_transformer": lambda z: transformer("vaswani_transformer", z),
    "vaswani_transformer-xavier-ffn": lambda z: transformer("vaswani_transformer", z, "--ffn-init", "xavier"),
    "vaswani_transformer-fairseq-positions": lambda z: transformer("vaswani_transformer", z, "--fairseq-positions"),
    "lstm": lambda z: ["--arch", "lstm", *rnn(z), "--encoder-bidirectional", "--decoder-attention", "1",
                       "--decoder-out-embed-dim", z["maxout"]],
    "rnnsearch": lambda z: ["--arch", "rnnsearch", *rnn(z), "--attention-hidden-size", z["att"],
                            "--maxout-dim", z["maxout"]],
}


def words_per_second(train_log):
    """Median of the wps fairseq-train logged (train_inner lines)."""
    values = [float(v) for v in re.findall(r"\| wps (\d+(?:\.\d+)?)", open(train_log).read())]
    return statistics.median(values) if values else None


def one_run(args, name, seed):
    langs = ["--source-lang", args.source_lang, "--target-lang", args.target_lang]
    flags = [str(f) for f in [*RUNS[name](SIZES[args.size]), *RECIPE, "--task", "translation", *langs,
                              *(["--cpu"] if args.device == "cpu" else [])]]
    run_name = f"{name}-seed{seed}"
    result = train_and_evaluate(args.work, run_name, args.data, flags, args.updates, args.minutes, average=0,
                                seed=seed, save_points=1, echo=False,
                                generate_flags=["--remove-bpe", "--tokenizer", "moses", *langs])
    result["wps"] = words_per_second(os.path.join(args.work, run_name, "train.log"))
    say(f"{run_name}: BLEU {result['bleu']}, chrF {result['chrf']}, {result['wps']} wps")
    return name, result


def mean_sd(values):
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def table(results, args):
    rows = ["| run | seeds | BLEU (mean ± sd) | chrF (mean ± sd) | BLEU per seed | train wps (median) |",
            "|---|---:|---:|---:|---|---:|"]
    for name in args.runs:
        mine = [r for n, r in results if n == name]
        bleu, chrf = mean_sd([r["bleu"] for r in mine]), mean_sd([r["chrf"] for r in mine])
        wps = statistics.median([r["wps"] for r in mine if r["wps"]] or [0])
        rows.append(f"| {name} | {len(mine)} | {bleu[0]:.2f} ± {bleu[1]:.2f} | {chrf[0]:.2f} ± {chrf[1]:.2f} | "
                    + ", ".join(str(r["bleu"]) for r in mine) + f" | {wps:.0f} |")
    return "\n".join(rows) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="fairseq-preprocess output (joined dictionary)")
    p.add_argument("--source-lang", required=True)
    p.add_argument("--target-lang", required=True)
    p.add_argument("--work", required=True, help="output folder")
    p.add_argument("--size", choices=sorted(SIZES), default="small")
    p.add_argument("--updates", type=int, default=500, help="updates per run (the budget)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--runs", default="transformer,vaswani_transformer,lstm,rnnsearch",
                   help="comma-separated, of: " + ", ".join(RUNS))
    p.add_argument("--jobs", type=int, default=2, help="runs at a time")
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every run (equal for all)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--minutes", type=float, default=120, help="safety limit per run")
    args = p.parse_args(argv)
    args.runs = args.runs.split(",")
    unknown = [r for r in args.runs if r not in RUNS]
    if unknown:
        p.error(f"--runs: unknown run {unknown[0]!r} (known: {', '.join(RUNS)})")
    if not os.path.isfile(os.path.join(args.data, f"dict.{args.source_lang}.txt")):
        p.error(f"--data {args.data}: no dict.{args.source_lang}.txt (fairseq-preprocess output expected)")
    if args.updates < 1 or args.jobs < 1 or args.threads < 1:
        p.error("--updates, --jobs and --threads must be at least 1")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.makedirs(args.work, exist_ok=True)
    # seeds outermost: a partial run already has every model at the first seeds
    calls = [lambda n=name, s=seed: one_run(args, n, s) for seed in args.seeds for name in args.runs]
    results = run_parallel(calls, args.jobs)
    text = table(results, args)
    with open(os.path.join(args.work, "parity.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.work, "parity.json"), "w") as f:
        json.dump([{"run": n, **r} for n, r in results], f, indent=1)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
