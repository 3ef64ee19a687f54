"""The benchmark run: fresh processes, time budget, interleaved repeats.

Each measurement runs in a fresh process forked from this one before it ran any tensor code
(so peak memory is per model, and CUDA is first initialised inside the measurement). Repeats
interleave ours and theirs (alternating who goes first). The budget bounds the whole run:
every measurement gets an equal share of the time left, the first measurement of each kind
fixes how many updates (or sentences) all later ones of that kind run, so ours and theirs
always see the same batches.
"""
import logging
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
import traceback
import warnings

import torch  # noqa: F401
import torch._dynamo  # noqa: F401  (torch.optim imports it lazily, seconds: once here, not per measurement)

from fairseq_plugins.errors import PluginError
from fairseq_plugins_lab.benchmarks.measure import measure_generation, measure_matmul_ceiling, measure_training
from fairseq_plugins_lab.benchmarks.presets import (
    COMPILED,
    MODELS,
    PRESETS,
    _dictionaries,
    _same_file,
    generation_argv,
    pair_flags,
    prepare_data,
    training_argv,
)
from fairseq_plugins_lab.benchmarks.report import format_report


def log(message: str):
    print(f"[benchmark] {message}", file=sys.stderr, flush=True)


def _child(target, job, conn):
    logging.getLogger().setLevel(logging.WARNING)  # fairseq's per-step INFO lines: not the report
    for category in (UserWarning, FutureWarning):  # hydra's and torch's deprecation notices
        warnings.simplefilter("ignore", category)
    if job["threads"]:
        torch.set_num_threads(job["threads"])
    try:
        result = target(job)
    except BaseException as e:  # reported to the parent, which stops the run
        bad_input = isinstance(e, PluginError)
        result = {"error": str(e) if bad_input else traceback.format_exc(), "bad_input": bad_input}
    conn.send(result)
    conn.close()


def in_fresh_process(target, job) -> dict:
    """Run ``target(job)`` in a new process forked from this one (which has imported torch and
    fairseq but run no tensor code), so its peak RSS and CUDA state are its own."""
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(target, job, send))
    proc.start()
    send.close()
    try:
        result = receive.recv()
    except EOFError:
        result = None
    proc.join()
    if result is None:
        raise PluginError(f"{target.__name__} died with exit code {proc.exitcode} (out of memory?)")
    if "error" in result:
        raise PluginError(result["error"] if result.get("bad_input") else
                          f"{target.__name__} of {job.get('label', 'the machine')} failed: {result['error']}")
    return result


class Budget:
    """Equal shares of the time left for the measurements still to run."""

    def __init__(self, minutes: float, measurements: int):
        self.end = time.time() + 60 * minutes
        self.left = measurements

    def deadline(self) -> float:
        share = max(self.end - time.time(), 0.0) / self.left
        self.left -= 1
        return time.time() + share


def run(args) -> str:
    preset = PRESETS[args.preset]
    start = time.time()
    args.load_at_start = os.getloadavg()[0]
    work_dir = tempfile.mkdtemp(prefix="fairseq-plugins-benchmark-")
    try:
        return _run(args, preset, work_dir, start)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


def _run(args, preset: dict, work_dir: str, start: float) -> str:
    precision = "fp16" if args.fp16 else "bf16" if args.bf16 else "fp32"
    base_job = {"device": args.device, "precision": precision, "threads": args.threads}
    pairs = args.pairs
    runs = [(pair, kind) for pair in pairs for kind in ("train", "generate")]
    measured = {(pair, kind): MODELS + ((COMPILED,) if kind == "generate" else ())
                for pair, kind in runs}
    table = {(pair, kind, model): [] for (pair, kind), models in measured.items() for model in models}  # -> repeats
    budget = Budget(args.budget_minutes, 1 + len(table) * args.repeats)
    log(f"matmul ceiling on {args.device}")
    machine = in_fresh_process(measure_matmul_ceiling, {**base_job, "deadline": budget.deadline()})
    if args.data is None:
        log("making the synthetic corpus")
        args.data = prepare_data(args, preset, work_dir)
    dict_src, dict_tgt = _dictionaries(args.data, args)
    shared_dictionary = _same_file(dict_src, dict_tgt)
    flags = {pair: pair_flags(pair, preset, shared_dictionary) for pair in pairs}
    # generation weights, saved by the first training of their model: the built-in transformer's
    # (ours decodes them converted, to compare hypotheses), each rnn its own
    trained_by = {(pair, model): "theirs" if pair == "transformer" else model for pair in pairs for model in MODELS}
    counts = {}  # (pair, kind) -> updates or sentences fixed by the first measurement
    for repeat in range(args.repeats):
        for pair, kind in runs:
            models = measured[(pair, kind)]
            order = models if repeat % 2 == 0 else models[::-1]
            for model in order:
                built = "ours" if model == COMPILED else model  # the compiled one is ours, decoding another way
                job = {**base_job, "label": f"{pair}/{model}", "deadline": budget.deadline(),
                       "train_argv": training_argv(args, flags[pair][built], work_dir, device=args.device,
                                                   fp16=args.fp16, num_workers=args.num_workers)}
                if kind == "train":
                    job.update(warmup=args.warmup, updates=counts.get((pair, kind), args.updates))
                    if repeat == 0 and trained_by[(pair, model)] == model:
                        job["save"] = os.path.join(work_dir, f"{pair}-{model}.pt")
                    target = measure_training
                else:
                    convert = pair == "transformer" and built == "ours"
                    weights = os.path.join(work_dir, f"{pair}-{trained_by[(pair, built)]}.pt")
                    compile_flag = ["--compile-decoding"] if model == COMPILED else []
                    job.update(gen_argv=generation_argv(args) + compile_flag, weights=weights, convert=convert,
                               count_flops=model != COMPILED,  # ours' arithmetic; the counter and dynamo do not mix
                               sentences=counts.get((pair, kind), args.sentences))
                    if convert:
                        # the built-in's options and weights, converted in the worker
                        job["train_argv"] = training_argv(args, flags[pair]["theirs"], work_dir, device=args.device,
                                                          fp16=args.fp16)
                    target = measure_generation
                began = time.time()
                result = in_fresh_process(target, job)
                rate = (f"{result['tokens_per_s']:,.0f} tokens/s over {result['updates']} updates" if kind == "train"
                        else f"{result['sentences_per_s']:,.1f} sentences/s over {result['sentences']} sentences")
                log(f"repeat {repeat + 1}/{args.repeats}: {kind} {pair} {model}: {rate} "
                    f"({time.time() - began:.0f} s in all)")
                done = result["updates"] if kind == "train" else result["sentences"]
                counts.setdefault((pair, kind), done)
                table[(pair, kind, model)].append(result)
    engine_rows = []
    if args.exports:
        from fairseq_plugins_lab.benchmarks.engines import ENGINES_MAX_LEN, measure_trained

        settings = {"data": args.data, "subset": "test", "threads": [args.threads or torch.get_num_threads()],
                    "repeats": args.repeats, "beam": args.beam, "max_len": args.max_len or ENGINES_MAX_LEN,
                    "batch_size": args.gen_batch}
        for pair in pairs:
            # CTranslate2 converts Transformers only
            names = [name for name in args.exports if name != "ctranslate2" or pair == "transformer"]
            convert = pair == "transformer"  # ours decodes the built-in's weights converted, as above
            job = {**base_job, "label": f"{pair}/engines", "pair": pair, "work_dir": work_dir, "convert": convert,
                   "weights": os.path.join(work_dir, f"{pair}-{trained_by[(pair, 'ours')]}.pt"),
                   "train_argv": training_argv(args, flags[pair]["theirs" if convert else "ours"], work_dir,
                                               device=args.device, fp16=args.fp16),
                   "engines": settings, "exports": [args.exports[name].engines for name in names]}
            log(f"engines: {pair}'s model exported ({', '.join(names) or 'none'}) and timed against fairseq-generate")
            engine_rows += in_fresh_process(measure_trained, job)["rows"]
    report = format_report(args, preset, precision, machine, table, counts, time.time() - start, engine_rows)
    return report
