"""The papers' claims at small scale, on two corpora, several seeds each, with equal budgets.

    bash examples/paper_claims/run.sh [--corpus synthetic,catalogs] [--seeds 1,2,3] [--jobs 2]

Corpora: ``synthetic``, the embedded language pair (training sentences of 5-50 words, test
sentences of 5-80), and ``catalogs``, English->German pairs from the local machine's gettext
catalogs (``fairseq-plugins-catalog-corpus``). On each, every model is trained once per seed
with the same number of updates (the two ``-clock`` runs get the same minutes instead), then
translated with beam 4 from the average of its last 5 checkpoints (one every 1/20 of the
budget, so the last quarter of the run; the learning rate is flat there). Each claim gets one
verdict per corpus, computed from the seeds' means and spread by the rule of
``fairseq_plugins_lab/claims.py``: it "holds" only if the difference of the means is
larger than the seed-to-seed standard deviation. WORK/REPORT.md holds the verdicts, mean ± std
tables, the BLEU-by-length plot with error bands, alignment pictures and training curves;
WORK/claims.csv every seed's raw numbers. ``--quick`` runs the same code on a tiny budget with
2 seeds (CI). Re-running skips every finished step; ``--jobs`` runs that many trainings at once.
"""
import argparse
import csv
import json
import os
import platform
import sys
import time

from fairseq_plugins.analysis import generate_output, report as report_io
from fairseq_plugins.analysis.bleu_by_length import scores_by_bucket, source_length
from fairseq_plugins_lab import claims, experiment

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Every model gets the same optimiser (Adam, see experiment.small_adam_recipe) and batch size.
# RNNsearch/RNNencdec start from PyTorch's initialisation, not the paper's N(0, 0.01^2)
# (appendix B.1, made for 5 days of Adadelta); both get the same one, so the comparison is fair.
CLOCK_UPDATES = 10 ** 7  # the -clock runs stop on time only
CLAIMS = [  # key, the claim as the papers make it (the verdict says whether it held here)
    ("search", "RNNsearch-50 above RNNencdec-50, BLEU (Bahdanau et al. Table 1)"),
    ("encdec_falls", "RNNencdec-50 falls with length: BLEU on the shortest third of the test sources above the "
                     "longest third (Bahdanau et al. Fig. 2)"),
    ("search_flat", "RNNsearch-50 does not fall with length: BLEU on the longest third above 90% of the "
                    "shortest third's (Fig. 2)"),
    ("reverse", "seq2seq LSTM: reversed source above plain, BLEU (Sutskever et al. §3.3)"),
    ("ensemble", "ensemble of the seeds' reversed LSTMs above one alone, BLEU (Sutskever et al. Table 1)"),
    ("ls_ppl", "label smoothing 0.1 makes perplexity worse: validation ppl of the scored checkpoint "
               "(Vaswani et al. §5.4)"),
    ("ls_bleu", "label smoothing 0.1 makes BLEU better (Vaswani et al. §5.4)"),
    ("average", "average of the last 5 checkpoints above the last checkpoint, BLEU of transformer-ls0.1 "
                "(Vaswani et al. §6.1)"),
    ("clock", "Transformer above RNNsearch-50 given the same wall-clock minutes, BLEU (Vaswani et al. Table 2)"),
]


def recipes(budget, max_tokens):
    """Training flags of every model; a Transformer warms up over 1/10 of the budget, then stays flat
    (fairseq's ``fixed`` schedule), so the averaged last quarter has one learning rate."""
    rnn = experiment.small_adam_recipe(lr=5e-3, max_tokens=max_tokens)

    def transformer(label_smoothing):
        return ["--arch", "vaswani_transformer_tiny", "--share-all-embeddings",
                *experiment.small_adam_recipe(lr=1e-3, max_tokens=max_tokens, label_smoothing=label_smoothing),
                "--lr-scheduler", "fixed", "--warmup-updates", str(max(1, budget // 10))]

    search = ["--arch", "rnnsearch_tiny", "--init", "pytorch", *rnn]
    return {
        "rnnencdec-50": dict(flags=["--arch", "rnnencdec_tiny", "--init", "pytorch", *rnn]),
        "rnnsearch-50": dict(flags=search),
        "seq2seq-reversed": dict(flags=["--arch", "seq2seq_lstm_tiny", "--reverse-source", *rnn]),
        "seq2seq-plain": dict(flags=["--arch", "seq2seq_lstm_tiny", "--no-reverse-source", *rnn]),
        "transformer-ls0.1": dict(flags=transformer(0.1), score_last=True,
                                  validate_scored=True),
        "transformer-ls0": dict(flags=transformer(0), validate_scored=True),
        "rnnsearch-clock": dict(flags=search, clock=True),
        "transformer-clock": dict(flags=transformer(0.1), clock=True),
    }


def prepare(corpus, work, args):
    """Raw text and fairseq data-bin of ``corpus``; returns (data-bin, generate flags, description)."""
    if corpus == "synthetic":
        raw = experiment.make_corpus(os.path.join(work, "raw"), train=args.train, valid=args.valid, test=args.test,
                                     min_len=5, max_len=50, test_max_len=80, rare_rate=0.01, seed=7)
        return (experiment.preprocess(raw, os.path.join(work, "data-bin")), [],
                f"embedded language pair: {args.train} training pairs of 5-50 words, {args.valid} validation and "
                f"{args.test} test pairs of 5-80")
    return catalog_corpus(work, args)


def catalog_corpus(work, args):
    """English->German from the gettext catalogs (fairseq-plugins-catalog-corpus), joint BPE."""
    out = os.path.join(work, "corpus")
    if not os.path.exists(os.path.join(out, "report.json")):
        # no placeholders: an untrained model that repeats `%s` scored 7-8 BLEU on the pairs that have them
        cmd = ["fairseq-plugins-catalog-corpus", "--lang", "de", "--out", out, "--valid", args.valid, "--test", args.test,
               "--bpe-ops", args.bpe_ops, "--placeholders", "drop",
               *[x for d in args.locale_dir for x in ("--locale-dir", d)]]
        experiment.run(cmd, os.path.join(work, "catalog_corpus.log"))
    with open(os.path.join(out, "report.json")) as f:
        pairs = json.load(f)["pairs"]
    data, bpe = os.path.join(work, "data-bin"), os.path.join(out, "bpe")
    if not os.path.exists(os.path.join(data, "test.en-de.de.idx")):
        experiment.run(["fairseq-preprocess", "--source-lang", "en", "--target-lang", "de", "--trainpref",
                        f"{bpe}/train", "--validpref", f"{bpe}/valid", "--testpref", f"{bpe}/test", "--destdir",
                        data, "--joined-dictionary", "--workers", 2], f"{data}.preprocess.log")
    return (data, ["--remove-bpe"], "English->German pairs of the gettext catalogs installed on the machine that "
            f"ran it: {pairs['train']} training, {pairs['valid']} validation, {pairs['test']} test pairs of "
            f"1-50 words, none with placeholders; joint BPE, {args.bpe_ops} merges")


def train_all(corpora, seeds, args):
    """Every (corpus, model, seed of ``seeds[corpus]``) run, ``args.jobs`` at a time.

    Returns results[corpus][model] = [one per seed]."""
    tasks, keys = [], []
    for seed in sorted(set().union(*seeds.values())):  # seed by seed: an interrupted run has whole seeds
        for corpus, (work, data, gen_flags, _) in corpora.items():
            for name, recipe in recipes(args.max_update, args.max_tokens).items() if seed in seeds[corpus] else ():
                clock = recipe.get("clock", False)
                kwargs = dict(seed=seed, save_points=20, validate_last_only=True,
                              score_last=recipe.get("score_last", False),
                              validate_scored=recipe.get("validate_scored", False), echo=args.jobs == 1,
                              average=0 if clock else 5, generate_flags=gen_flags)
                budget = (CLOCK_UPDATES, args.clock_minutes) if clock else (args.max_update, args.minutes)
                tasks.append(lambda w=work, n=f"{name}/seed{seed}", d=data, f=recipe["flags"], b=budget, k=kwargs:
                             experiment.train_and_evaluate(w, n, d, f, *b, **k))
                keys.append((corpus, name))
    results = {corpus: {} for corpus in corpora}
    for (corpus, name), result in zip(keys, experiment.run_parallel(tasks, args.jobs)):
        results[corpus].setdefault(name, []).append(result)
    return results


def ensemble(work, data, gen_flags, runs):
    """BLEU of the reversed LSTMs of every seed together (fairseq-generate --path a:b:c)."""
    out = os.path.join(work, "seq2seq-ensemble", "seeds" + "-".join(str(r["seed"]) for r in runs))
    os.makedirs(out, exist_ok=True)
    paths = ":".join(r["checkpoint"] for r in runs)
    return experiment.score(experiment.generate(data, paths, os.path.join(out, "generate.txt"), gen_flags))


def by_length(work, name, runs):
    """Per seed: (bucket edges, [(sentences, BLEU) per sixth of the test set], BLEU of shortest/longest third)."""
    systems = []
    for r in runs:
        gens = generate_output.read_generate(os.path.join(work, name, f"seed{r['seed']}", "generate.txt"))
        systems.append(generate_output.System(name, "", [g.output for g in gens], [g.ref for g in gens],
                                              [g.src for g in gens]))
    lengths = [source_length(s) for s in systems[0].srcs]
    sixths, thirds = claims.quantile_edges(lengths, 6), claims.quantile_edges(lengths, 3)
    rows = [scores_by_bucket(s, sixths, "13a") for s in systems]
    ends = [scores_by_bucket(s, thirds, "13a") for s in systems]
    return sixths, rows, [(e[0][1], e[-1][1]) for e in ends]


def verdicts(results, lengths, ens):
    """The comparison behind every claim of CLAIMS, for one corpus."""
    bleu = {name: [r["bleu"] for r in runs] for name, runs in results.items()}
    ls = results["transformer-ls0.1"]
    return {
        "search": claims.compare(bleu["rnnsearch-50"], bleu["rnnencdec-50"]),
        "encdec_falls": claims.compare(*zip(*lengths["rnnencdec-50"])),
        "search_flat": claims.compare([long_ for _, long_ in lengths["rnnsearch-50"]],
                                      [0.9 * short for short, _ in lengths["rnnsearch-50"]]),
        "reverse": claims.compare(bleu["seq2seq-reversed"], bleu["seq2seq-plain"]),
        "ensemble": claims.compare([ens["bleu"]], bleu["seq2seq-reversed"]),
        "ls_ppl": claims.compare(*[[r["scored_valid"]["ppl"] for r in results[n]]
                                   for n in ("transformer-ls0.1", "transformer-ls0")]),
        "ls_bleu": claims.compare(bleu["transformer-ls0.1"], bleu["transformer-ls0"]),
        "average": claims.compare([r["bleu"] for r in ls], [r["last"]["bleu"] for r in ls]),
        "clock": claims.compare(bleu["transformer-clock"], bleu["rnnsearch-clock"]),
    }


def figures(corpus, work, out, data, results, lengths_rows):
    """BLEU-by-length plot with error bands, alignment pictures and training curves of one corpus."""
    edges, rows = lengths_rows["edges"], lengths_rows["rows"]
    labels = [f"{a}-{b - 1}" for a, b in zip(edges, edges[1:])] + [f"{edges[-1]}+"]
    series = {name: [[r[b][1] for r in rows[name] if r[b][1] is not None] for b in range(len(labels))]
              for name in rows}
    claims.plot_bands(os.path.join(out, f"bleu_by_length-{corpus}.png"), labels, series, title=corpus)
    table = [[label, str(rows["rnnsearch-50"][0][b][0]), *[claims.mean_std(series[n][b]) if series[n][b] else "-"
                                                           for n in rows]] for b, label in enumerate(labels)]
    # two test sentences of 8-20 source words: readable pictures
    gens = generate_output.read_generate(os.path.join(work, "rnnsearch-50", f"seed{results['rnnsearch-50'][0]['seed']}",
                                          "generate.txt"))
    ids = [g.id for g in gens if 8 <= source_length(g.src) <= 20][:2] or [gens[0].id]
    experiment.run(["fairseq-plugins-plot-alignment", "--path", results["rnnsearch-50"][0]["checkpoint"], "--data",
                    data, "--ids", ",".join(map(str, ids)), "--beam", "4", "--join-bpe", "--out",
                    os.path.join(out, f"alignments-{corpus}")], os.path.join(work, "alignments.log"))
    experiment.run(["fairseq-plugins-plot-curves", *[f"--log={n}={work}/{n}/seed{runs[0]['seed']}/train.log"
                                                     for n, runs in results.items() if "clock" not in n],
                    "--out", os.path.join(out, f"curves-{corpus}")], os.path.join(work, "curves.log"))
    return (report_io.markdown_table(["source words", "sentences", *[f"BLEU {n}" for n in rows]], table),
            [f"alignments-{corpus}/alignment-{i}.png" for i in ids])


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def side_by_side(names, header, rows):
    """A markdown table whose columns ``header`` repeat once per corpus of ``names``."""
    return report_io.markdown_table(["model", *[f"{c} {h}" for c in names for h in header]], rows)


def cell(runs, key, digits=1):
    return claims.mean_std([key(r) for r in runs], digits)


def report(argv, out, corpora, results, extra, seconds, load):
    names = list(corpora)
    head = " | ".join(names)
    shown = [a for i, a in enumerate(argv) if a != "--note" and (i == 0 or argv[i - 1] != "--note")]
    lines = ["# Paper claims at small scale, several seeds", "",
             f"Command: `bash examples/paper_claims/run.sh {' '.join(shown)}"
             + (" --note ...` (the paragraph below)" if len(shown) < len(argv) else "`") + ", "
             f"{time.strftime('%Y-%m-%d')}; "
             f"machine: {cpu_model()}, {os.cpu_count()} cores, load average {load[0]:.1f} at the start "
             f"and {load[1]:.1f} at the end (other work shared the cores); wall time {seconds / 60:.0f} minutes "
             f"(of this invocation; steps an earlier one finished are reused).", "",
             *([extra["note"], ""] if extra["note"] else []),
             *[f"- **{c}**: {corpora[c][3]}." for c in names], "",
             "Every model: seeds " + "; ".join(
                 f"{', '.join(str(r['seed']) for r in results[c]['rnnsearch-50'])} ({c})" for c in names) + "; "
             f"{extra['max_update']} updates (safety net {extra['minutes']:g} minutes), "
             f"{extra['max_tokens']} tokens per batch, Adam "
             "(RNNs lr 5e-3 flat; Transformer lr 1e-3 after a linear warm-up over the first tenth, then flat), "
             "a checkpoint every 1/20 of the budget, validated from the last quarter on, the average of the last 5 "
             "(the last quarter) translated "
             f"with beam 4. The -clock runs get {extra['clock_minutes']:g} minutes each and no update limit. "
             f"{extra['jobs']} trainings ran at a time, 1 thread each.", "",
             "## Verdicts", "",
             "Rule (fairseq_plugins_lab/claims.py): with d = mean(a) − mean(b) over the seeds and spread = "
             "the larger sample standard deviation of the two sides, a claim *holds* if d > spread, *does not "
             "hold* if d < −spread, and is *not separable from seed spread* otherwise. A rule of thumb for "
             "a few seeds, not a significance test.", "",
             f"| claim | {head} |", "|---|" + "---|" * len(names)]
    lines += [f"| {text} | " + " | ".join(claims.describe(extra["verdicts"][c][key]) for c in names) + " |"
              for key, text in CLAIMS]
    bleu_rows = [[name, *[x for c in names for x in (
        cell(results[c][name], lambda r: r["bleu"]), cell(results[c][name], lambda r: r["chrf"]),
        cell(results[c][name], lambda r: r["updates"], 0), cell(results[c][name], lambda r: r["train_minutes"]))]]
        for name in results[names[0]]]
    ens = extra["ensemble"]
    bleu_rows.append(["seq2seq-ensemble (all seeds' seq2seq-reversed)",
                      *[x for c in names for x in (ens[c]["bleu"], ens[c]["chrf"], "-", "-")]])
    lines += ["", "## BLEU and chrF, mean ± std over seeds", "",
              side_by_side(names, ["BLEU", "chrF", "updates", "minutes"], bleu_rows),
              "## Label smoothing and checkpoint averaging", "",
              "Perplexity: *best valid* is the lowest validation perplexity fairseq-train logged during training; "
              "*scored* is that of the checkpoint translated (the average of the last 5), from fairseq-validate.", ""]
    ls_rows = [[name, *[x for c in names for x in (
        cell(results[c][name], lambda r: r["valid"]["ppl"], 2),
        cell(results[c][name], lambda r: r["scored_valid"]["ppl"], 2),
        cell(results[c][name], lambda r: r["last"]["bleu"]) if "last" in results[c][name][0] else "-",
        cell(results[c][name], lambda r: r["bleu"]))]] for name in ("transformer-ls0.1", "transformer-ls0")]
    lines.append(side_by_side(names, ["best valid ppl", "scored ppl", "last BLEU", "average BLEU"], ls_rows))
    lines += ["", "## BLEU by source length (Bahdanau et al. Fig. 2)", "",
              "Test sentences cut into sixths by source length (words); each bucket scored as its own corpus. "
              "The length verdicts compare the shortest and the longest third.", ""]
    for c in names:
        table, pictures = extra["figures"][c]
        lines += [f"### {c}", "", f"![BLEU by source length, {c}](bleu_by_length-{c}.png)", "", table,
                  f"Alignments of RNNsearch-50 (seed {results[c]['rnnsearch-50'][0]['seed']}, beam 4):", "",
                  *[f"![alignment]({p})" for p in pictures], "",
                  f"Training curves (first seed): ![curves](curves-{c}.png)", ""]
    lines += ["## Raw numbers", "", "Every seed of every run: [claims.csv](claims.csv)."]
    report_io.write_text(os.path.join(out, "REPORT.md"), "\n".join(lines) + "\n")
    with open(os.path.join(out, "claims.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["corpus", "model", "seed", "bleu", "chrf", "last_bleu", "best_valid_ppl", "scored_valid_ppl",
                    "updates", "train_minutes", "bleu_shortest_third", "bleu_longest_third"])
        for c in names:
            for name, runs in results[c].items():
                ends = extra["lengths"][c].get(name, [(None, None)] * len(runs))
                for r, (short, long_) in zip(runs, ends):
                    w.writerow([c, name, r["seed"], r["bleu"], r["chrf"], r.get("last", {}).get("bleu"),
                                (r["valid"] or {}).get("ppl"), (r.get("scored_valid") or {}).get("ppl"),
                                r["updates"], r["train_minutes"], *[None if x is None else round(x, 2)
                                                                    for x in (short, long_)]])
            w.writerow([c, "seq2seq-ensemble", "all", extra["ensemble"][c]["bleu"], extra["ensemble"][c]["chrf"],
                        *[None] * 7])
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", default=os.path.join(REPO, "work", "paper_claims"))
    p.add_argument("--corpus", default="synthetic,catalogs", help="comma-separated: synthetic, catalogs")
    p.add_argument("--seeds", default="1,2,3", help="comma-separated training seeds")
    p.add_argument("--corpus-seeds", action="append", default=[], metavar="CORPUS=SEEDS",
                   help="other seeds for one corpus, e.g. catalogs=1,2 (repeatable)")
    p.add_argument("--jobs", type=int, default=2, help="trainings at a time (each 1 thread)")
    p.add_argument("--train", type=int, default=6000, help="synthetic training sentence pairs (5 to 50 words)")
    p.add_argument("--valid", type=int, default=300, help="validation sentence pairs (both corpora)")
    p.add_argument("--test", type=int, default=300, help="synthetic test sentence pairs (5 to 80 words)")
    p.add_argument("--max-update", type=int, default=1000, help="updates per model (the equal budget)")
    p.add_argument("--max-tokens", type=int, default=2048, help="tokens per batch")
    p.add_argument("--minutes", type=float, default=10.0, help="training time limit per model (a safety net)")
    p.add_argument("--clock-minutes", type=float, default=2.0, help="training minutes of each -clock run")
    p.add_argument("--locale-dir", action="append", default=[],
                   help="gettext locale folder of the catalogs (repeatable; default: the system's)")
    p.add_argument("--bpe-ops", type=int, default=4000, help="BPE merges of the catalog corpus")
    p.add_argument("--note", default="", help="a paragraph for the top of the report (e.g. what was cut)")
    p.add_argument("--quick", action="store_true",
                   help="the same code on a tiny budget with 2 seeds (CI): checks that the report is produced, "
                   "not the claims")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    if args.quick:
        # 5 updates: every interval checkpoint is one of the 5 averaged; the -clock runs still stop on time
        args.train, args.valid, args.test, args.max_update, args.minutes, args.clock_minutes = 300, 20, 20, 5, 2.0, 0.02
        if "--seeds" not in argv:
            args.seeds = "1,2"
        if "--corpus" not in argv:
            args.corpus = "synthetic"
    names = args.corpus.split(",")
    for name in names:
        if name not in ("synthetic", "catalogs"):
            p.error(f"--corpus {name}: expected synthetic or catalogs")
    seeds = {name: args.seeds for name in names}
    for spec in args.corpus_seeds:
        name, _, value = spec.partition("=")
        if name not in seeds:
            p.error(f"--corpus-seeds {spec}: {name} is not one of --corpus {args.corpus}")
        seeds[name] = value
    try:
        seeds = {name: [int(s) for s in value.split(",")] for name, value in seeds.items()}
    except ValueError:
        p.error(f"--seeds/--corpus-seeds: expected comma-separated integers, got {seeds}")
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread per training: --jobs of them share the cores
    start, load = time.time(), os.getloadavg()[0]
    corpora = {}
    for name in names:
        work = os.path.join(args.work, name)
        os.makedirs(work, exist_ok=True)
        corpora[name] = (work, *prepare(name, work, args))
    results = train_all(corpora, seeds, args)
    extra = {"max_update": args.max_update, "max_tokens": args.max_tokens, "minutes": args.minutes,
             "clock_minutes": args.clock_minutes,
             "jobs": args.jobs, "note": args.note, "ensemble": {}, "lengths": {}, "verdicts": {}, "figures": {}}
    for name, (work, data, gen_flags, _) in corpora.items():
        extra["ensemble"][name] = ensemble(work, data, gen_flags, results[name]["seq2seq-reversed"])
        rows, ends = {}, {}
        for model in ("rnnencdec-50", "rnnsearch-50"):
            edges, rows[model], ends[model] = by_length(work, model, results[name][model])
        extra["lengths"][name] = ends
        extra["verdicts"][name] = verdicts(results[name], ends, extra["ensemble"][name])
        extra["figures"][name] = figures(name, work, args.work, data, results[name], {"edges": edges, "rows": rows})
    text = report(argv, args.work, corpora, results, extra, time.time() - start, (load, os.getloadavg()[0]))
    print(text)


if __name__ == "__main__":
    main()
