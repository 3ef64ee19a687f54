"""The benchmark's markdown report: medians, ratios ours/theirs, targets and run details."""
import datetime
import os
import platform
import shlex
import statistics
import sys
from typing import Dict, List

import fairseq
import torch

from fairseq_plugins.analysis.report import markdown_table
from fairseq_plugins.hardware import describe_cpu
from fairseq_plugins_lab.benchmarks.presets import COMPILED, MODELS, length_limits

# The suite's performance targets, ours / built-in at the cpu preset in fp32, by row: (ratio,
# "min" or "max"). The Transformer's training target was 1.15x until fp32 training proved
# matmul-bound for both; its generation target is the one at beam 4 (2.0x at beam 8 with
# 100-token hypotheses: reports/benchmarks/README.md); rnnsearch's generation is compared per hypothesis
# token, as its hypotheses and lstm's differ in length unless --max-len fixes them.
TARGETS = {
    ("transformer", "train target tokens/s"): (1.0, "min"),
    ("transformer", "generate sentences/s"): (1.5, "min"),
    **{("transformer", f"{phase} peak {kind} (MiB)"): (1.0, "max")
       for phase in ("train", "generate") for kind in ("RSS", "CUDA memory")},
    ("rnnsearch", "train target tokens/s"): (1.0, "min"),
    ("rnnsearch", "generate hypothesis tokens/s"): (1.3, "min"),
    ("rnnsearch", "train peak RSS (MiB)"): (1.0, "max"),
}
ONNX_TARGETS = {"onnx float32": 1.5, "onnx int8": 2.5}  # rnnsearch, sentences per CPU-second
PAIR_LABELS = {"transformer": ("vaswani_transformer", "transformer"), "rnnsearch": ("rnnsearch", "lstm")}


def _median(results: List[dict], key: str) -> float:
    return statistics.median(r[key] for r in results)


def _target(pair: str, name: str, ratio: float) -> str:
    name = name.split(" (beam")[0]
    if (pair, name) not in TARGETS:
        return ""
    bound, sense = TARGETS[(pair, name)]
    met = ratio >= bound if sense == "min" else ratio <= bound
    return f"{'≥' if sense == 'min' else '≤'} {bound:.2f}× {'✓' if met else '✗'}"


def _hypotheses_row(pair: str, table) -> List[str]:
    ours = table[(pair, "generate", "ours")][0]["hypotheses"]
    theirs = table[(pair, "generate", "theirs")][0]["hypotheses"]
    same = sum(ours[i] == theirs.get(i) for i in ours)
    identical = same == len(ours) == len(theirs)
    note = "same weights (converted)" if pair == "transformer" else "different models, not expected"
    return [pair, "hypotheses identical", f"{identical} ({same}/{len(ours)})", note, "", ""]


def _compiled_rows(pair: str, table, ceiling: float) -> List[List[str]]:
    """``--compile-decoding`` against ours eager: speed, its matmuls' GFLOP/s (ours eager's per
    sentence), the first batch (compiling, or loading torch's cached code in later repeats) and
    the hypotheses (the same expected)."""
    compiled = table.get((pair, "generate", COMPILED))
    if not compiled:
        return []
    eager = table[(pair, "generate", "ours")]
    speed, theirs = _median(compiled, "sentences_per_s"), _median(table[(pair, "generate", "theirs")], "sentences_per_s")
    first = ", ".join(f"{r['first_batch_seconds']:.1f}" for r in compiled)
    eager_first = ", ".join(f"{r['first_batch_seconds']:.1f}" for r in eager)
    flops = _median(eager, "flops_per_sentence") * speed
    ours, mine = eager[0]["hypotheses"], compiled[0]["hypotheses"]
    same = sum(mine[i] == ours.get(i) for i in mine)
    return [
        [pair, "compiled decoding (--compile-decoding): generate sentences/s", f"{speed:,.1f}",
         f"{theirs:,.1f}", f"{speed / theirs:.2f}×",
         f"{speed / _median(eager, 'sentences_per_s'):.2f}× ours eager"],
        [pair, "compiled decoding: generate matmul GFLOP/s (% of the ceiling)",
         f"{flops / 1e9:,.1f} ({100 * flops / ceiling:.1f}%)", "", "", ""],
        [pair, "compiled decoding: first batch s, per repeat (compiling, or loading torch's cache)", first,
         f"ours eager: {eager_first}", "", ""],
        [pair, "compiled decoding: hypotheses identical to ours eager", f"{same == len(mine) == len(ours)} "
         f"({same}/{len(mine)})", "", "", ""],
    ]


def format_report(args, preset, precision, machine, table, counts, seconds, engine_rows=()) -> str:
    ceiling = machine["ceilings"][precision]
    max_len_a, max_len_b = length_limits(args)
    rows = []
    for pair in args.pairs:
        ours_name, theirs_name = PAIR_LABELS[pair]
        train = {m: table[(pair, "train", m)] for m in MODELS}
        gen = {m: table[(pair, "generate", m)] for m in MODELS}
        metrics = [
            ("train target tokens/s", train, "tokens_per_s", "{:,.0f}"),
            (f"generate sentences/s (beam {args.beam})", gen, "sentences_per_s", "{:,.1f}"),
            ("generate hypothesis tokens/s", gen, "hyp_tokens_per_s", "{:,.0f}"),
            ("train peak RSS (MiB)", train, "peak_rss_mb", "{:,.0f}"),
            ("generate peak RSS (MiB)", gen, "peak_rss_mb", "{:,.0f}"),
        ]
        if args.device == "cuda":
            metrics += [("train peak CUDA memory (MiB)", train, "cuda_peak_mb", "{:,.0f}"),
                        ("generate peak CUDA memory (MiB)", gen, "cuda_peak_mb", "{:,.0f}")]
        for name, results, key, fmt in metrics:
            ours, theirs = _median(results["ours"], key), _median(results["theirs"], key)
            digits = 3 if "peak" in name else 2
            rows.append([pair, name, fmt.format(ours), fmt.format(theirs), f"{ours / theirs:.{digits}f}×",
                         _target(pair, name, ours / theirs)])
        model_flops = {m: _median(train[m], "flops_per_token") * _median(train[m], "tokens_per_s") for m in MODELS}
        rows.append([pair, f"train model GFLOP/s (% of {precision} matmul ceiling)",
                     *(f"{model_flops[m] / 1e9:,.1f} ({100 * model_flops[m] / ceiling:.1f}%)" for m in MODELS),
                     f"{model_flops['ours'] / model_flops['theirs']:.2f}×", ""])
        gen_flops = {m: _median(gen[m], "flops_per_sentence") * _median(gen[m], "sentences_per_s") for m in MODELS}
        rows.append([pair, f"generate matmul GFLOP/s (% of {precision} matmul ceiling)",
                     *(f"{gen_flops[m] / 1e9:,.1f} ({100 * gen_flops[m] / ceiling:.1f}%)" for m in MODELS),
                     f"{gen_flops['ours'] / gen_flops['theirs']:.2f}×", ""])
        rows.append(_hypotheses_row(pair, table))
        rows += _compiled_rows(pair, table, ceiling)
    header = ["pair", "measurement", "ours", "fairseq built-in", "ours / built-in", "target (cpu preset, fp32)"]
    ceilings = ", ".join(f"{k} {v / 1e9:,.0f} GFLOP/s" for k, v in machine["ceilings"].items())
    if "bf16" not in machine["ceilings"]:
        ceilings += ", bf16 not native on this device (not measured)"
    ceilings += "; the fastest of: " + ", ".join(f"{k} {v / 1e9:,.0f}" for k, v in machine["kernels"].items())
    details = []
    for (pair, kind, model), results in table.items():
        key = "tokens_per_s" if kind == "train" else "sentences_per_s"
        values = ", ".join(f"{r[key]:,.1f}" for r in results)
        extra = (f"; hypothesis length {results[0]['hyp_tokens_per_sentence']:.1f} tokens" if kind == "generate"
                 else f"; {_median(results, 'flops_per_token') / 1e6:.1f} MFLOP per target token")
        name = f"{PAIR_LABELS[pair][0]}, --compile-decoding" if model == COMPILED else PAIR_LABELS[pair][MODELS.index(model)]
        details.append(f"- {kind} {pair} {model} ({name}): {values}{extra}")
    report = [
        "# fairseq-plugins benchmark: ours vs fairseq's built-ins",
        "",
        *describe_run(args, seconds, f" (torch threads {machine['threads']}), GPU: {machine.get('gpu', 'none')}"),
        f"- settings: device {args.device}, precision {precision}"
        f"{' (torch.autocast, fp32 weights)' if precision == 'bf16' else ''}, preset {args.preset}, "
        f"data {args.data_label}, --max-tokens {args.max_tokens}, {args.warmup} warm-up + 1 FLOP-counting + "
        f"{counts[(args.pairs[0], 'train')]} timed updates, "
        f"{counts[(args.pairs[0], 'generate')]} test sentences at beam {args.beam} (batch {args.gen_batch}, "
        f"length {args.min_len} to {max_len_a}·|x|+{max_len_b}), {args.repeats} repeats interleaved (medians)",
        f"- matmul ceiling: {ceilings}",
        "",
        *markdown_table(header, rows).splitlines(),
        "",
        "Per repeat (tokens/s or sentences/s):",
        "",
        *details,
        "",
    ]
    if engine_rows:
        report += [
            "## Engines (`--onnx`, `--ctranslate2`)",
            "",
            f"The suite's model of each pair (the Transformer: the built-in's weights converted) decoded by "
            f"fairseq-generate, with the suite's decoding options (--compile-decoding, alone and with "
            f"--quantize-decoding int8), and exported to each engine asked for "
            f"(ONNX Runtime: fairseq-plugins-export-onnx; CTranslate2: the Transformer only), on the whole test "
            f"split: beam {args.beam}, lengths 1 to {engine_rows[0]['max_len']}, batches of {args.gen_batch}, "
            f"{args.repeats} repeats interleaved (medians). Targets for rnnsearch at the cpu preset: ONNX Runtime "
            f"float32 ≥ {ONNX_TARGETS['onnx float32']:.1f}× and int8 ≥ {ONNX_TARGETS['onnx int8']:.1f}× "
            "fairseq-generate per CPU-second.",
            "",
            *engine_table(engine_rows).splitlines(),
            "",
        ]
    return "\n".join(report)


def describe_run(args, seconds: float, hardware: str = "") -> List[str]:
    """The report's first lines: date, machine and its load, software, command."""
    return [
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}; run took {seconds / 60:.1f} min",
        f"- machine: {describe_cpu()}, {os.cpu_count()} cores{hardware}; {platform.platform()}; load average at "
        f"start/end {args.load_at_start:.1f}/{os.getloadavg()[0]:.1f} (other processes share the machine)",
        f"- software: Python {platform.python_version()}, torch {torch.__version__}, fairseq {fairseq.__version__}",
        f"- command: `{shlex.join(args.invocation)}`",
    ]


def engine_table(rows: List[Dict]) -> str:
    """The markdown table of :func:`~fairseq_plugins_lab.benchmarks.engines.time_engines`'s rows,
    each engine against fairseq's row of the same model and threads."""
    table = []
    for row in rows:
        fairseq = next(r for r in rows if r["checkpoint"] == row["checkpoint"] and r["threads"] == row["threads"]
                       and r["engine"] == "fairseq")
        cells = [os.path.basename(os.path.dirname(row["checkpoint"])) or row["checkpoint"], str(row["threads"]),
                 row["engine"]]
        for key in ("sentences_per_s", "sentences_per_cpu_s"):
            speed = statistics.median(row[key])
            cells += [f"{speed:.1f}", " / ".join(f"{s:.1f}" for s in row[key]),
                      f"{speed / statistics.median(fairseq[key]):.2f}×"]
        table.append(cells + [f"{row['bleu']:.2f}", row["identical"]])
    return markdown_table(["model", "threads", "engine", "sentences/s (median)", "per repeat", "vs fairseq",
                           "sentences per CPU-second (median)", "per repeat", "vs fairseq", "BLEU",
                           "hypotheses = fairseq's"], table)


def write_report(report: str, out=None):
    """Print ``report``; with ``out``, write it there too."""
    print(report)
    if out:
        with open(out, "w", encoding="utf-8") as f:
            f.write(report)
        print(f"[benchmark] wrote {out}", file=sys.stderr, flush=True)
