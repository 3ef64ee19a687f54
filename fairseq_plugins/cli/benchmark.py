"""Side-by-side benchmark of the suite's models against fairseq's built-ins, in one run.

    fairseq-plugins-benchmark [--data DIR] [--preset tiny|cpu|base|big] [--device cpu|cuda]
                              [--fp16 | --bf16] [--repeats 3] [--budget-minutes M] [--out FILE]

Pairs, on the same data and with the same flags (sizes of each preset in ``PRESETS``):

* ``vaswani_transformer`` vs fairseq's ``transformer`` of identical size;
* ``rnnsearch`` vs fairseq's ``lstm`` (bidirectional encoder, attention) at equal hidden sizes.

Measurements, each in a fresh process forked from this one before it ran any tensor code
(so peak memory is per model, and CUDA is first initialised inside the measurement):

* training: target tokens/s of fairseq's own ``Trainer.train_step`` (data loading included,
  as in ``fairseq-train``) over a fixed number of updates after warm-up updates;
* generation: sentences/s of beam search through ``task.build_generator`` (fairseq's
  SequenceGenerator) on the test split, after one untimed batch. Our transformer decodes with
  the built-in's trained weights converted by ``fairseq-plugins-convert-transformer``'s
  functions, and the hypotheses of the two are compared;
* peak memory: the process's RSS high-water mark (``ru_maxrss``), and on CUDA
  ``torch.cuda.max_memory_allocated``;
* model FLOP/s: matmul/attention FLOPs of forward+backward per target token, counted by
  ``torch.utils.flop_counter`` on one more untimed update after the warm-up, times the
  measured tokens/s, against the matmul ceiling measured at the start (one large matmul per
  precision).

Repeats interleave ours and theirs (alternating who goes first); the table gives medians and
ratios ours/theirs. ``--budget-minutes`` bounds the whole run: every measurement gets an equal
share of the time left, the first measurement of each kind fixes how many updates (or
sentences) all later ones of that kind run, so ours and theirs always see the same batches.
"""
import argparse
import datetime
import logging
import math
import multiprocessing
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from contextlib import nullcontext
from typing import Dict, List

import fairseq
import numpy as np
import torch
import torch._dynamo  # noqa: F401  (torch.optim imports it lazily, seconds: once here, not per measurement)
from fairseq import options, tasks, utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.trainer import Trainer
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

import fairseq_plugins
from fairseq_plugins.cli.convert_transformer import convert_args, convert_state_dict
from fairseq_plugins.errors import PluginError

USER_DIR = os.path.dirname(os.path.abspath(fairseq_plugins.__file__))
PAIR_NAMES = ("transformer", "rnnsearch")
MODELS = ("ours", "theirs")

# Sizes per preset. Transformer: layers per side, d_model, d_ff, heads. RNN: embedding E,
# encoder hidden H per direction, decoder hidden, attention hidden n', maxout l (= lstm's
# decoder-out-embed-dim, so both end in an l x V softmax). cpu: the anchor of
# ../shared/notes/fairseq-on-this-machine.md; base/big: the papers' sizes (for GPUs).
PRESETS = {
    "tiny": dict(layers=1, d_model=32, d_ff=64, heads=2, transformer_archs=("vaswani_transformer", "transformer"),
                 embed=16, enc_hidden=32, dec_hidden=64, att_hidden=64, maxout=32,
                 warmup=1, updates=2, sentences=4, gen_batch=4, max_tokens=256, corpus=(300, 10, 20, 5, 12),
                 budget=3),
    "cpu": dict(layers=3, d_model=256, d_ff=1024, heads=4, transformer_archs=("vaswani_transformer", "transformer"),
                embed=256, enc_hidden=256, dec_hidden=512, att_hidden=512, maxout=256,
                warmup=3, updates=30, sentences=200, gen_batch=32, max_tokens=4096, corpus=(10000, 100, 200, 10, 40),
                budget=25),
    "base": dict(layers=6, d_model=512, d_ff=2048, heads=8,
                 transformer_archs=("vaswani_transformer_base", "transformer"),
                 embed=620, enc_hidden=1000, dec_hidden=1000, att_hidden=1000, maxout=500,
                 warmup=10, updates=200, sentences=1000, gen_batch=128, max_tokens=4096,
                 corpus=(20000, 100, 1000, 10, 40), budget=7),
    "big": dict(layers=6, d_model=1024, d_ff=4096, heads=16,
                transformer_archs=("vaswani_transformer_big", "transformer_vaswani_wmt_en_de_big"),
                embed=620, enc_hidden=1000, dec_hidden=1000, att_hidden=1000, maxout=500,
                warmup=10, updates=200, sentences=1000, gen_batch=128, max_tokens=4096,
                corpus=(20000, 100, 1000, 10, 40), budget=7),
}
MAX_LEN_A, MAX_LEN_B = 1.2, 10  # generation length limit a·|x| + b (fairseq-generate's flags)


# --------------------------------------------------------------------------- flags of a run

def pair_flags(pair: str, preset: dict, shared_dictionary: bool) -> Dict[str, List[str]]:
    """Model flags of ours and theirs; every size flag is given to both."""
    if pair == "transformer":
        sizes = []
        for side in ("encoder", "decoder"):
            sizes += [f"--{side}-layers", preset["layers"], f"--{side}-embed-dim", preset["d_model"],
                      f"--{side}-ffn-embed-dim", preset["d_ff"], f"--{side}-attention-heads", preset["heads"]]
        sizes.append("--share-all-embeddings" if shared_dictionary else "--share-decoder-input-output-embed")
        ours_arch, theirs_arch = preset["transformer_archs"]
        return {"ours": ["--arch", ours_arch, *sizes], "theirs": ["--arch", theirs_arch, *sizes]}
    sizes = ["--encoder-embed-dim", preset["embed"], "--decoder-embed-dim", preset["embed"],
             "--encoder-hidden-size", preset["enc_hidden"], "--decoder-hidden-size", preset["dec_hidden"],
             "--encoder-layers", 1, "--decoder-layers", 1]
    return {"ours": ["--arch", "rnnsearch", *sizes, "--attention-hidden-size", preset["att_hidden"],
                     "--maxout-dim", preset["maxout"]],
            "theirs": ["--arch", "lstm", *sizes, "--encoder-bidirectional", "--decoder-attention", "1",
                       "--decoder-out-embed-dim", preset["maxout"]]}


def device_flags(args) -> List[str]:
    return (["--cpu"] if args.device == "cpu" else []) + (["--fp16"] if args.fp16 else [])


def training_argv(args, model_flags: List[str], save_dir: str,
                  criterion: str = "label_smoothed_cross_entropy") -> List[str]:
    return [str(a) for a in [
        args.data, "--user-dir", USER_DIR, "--task", "translation", *args.lang_flags, *model_flags,
        "--dropout", 0.1, "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", 7e-4,
        "--lr-scheduler", "inverse_sqrt", "--warmup-updates", 20, "--warmup-init-lr", 1e-7,
        "--criterion", criterion, "--label-smoothing", 0.1,
        "--max-tokens", args.max_tokens, "--seed", 1, "--num-workers", args.num_workers,
        "--disable-validation", "--no-progress-bar", "--save-dir", save_dir, *device_flags(args)]]


def generation_argv(args) -> List[str]:
    return [str(a) for a in [
        args.data, "--user-dir", USER_DIR, "--task", "translation", *args.lang_flags, "--gen-subset", "test",
        "--beam", 4, "--batch-size", args.gen_batch, "--max-len-a", MAX_LEN_A, "--max-len-b", MAX_LEN_B,
        "--min-len", args.min_len,
        "--seed", 1, "--num-workers", 0, *device_flags(args)]]


# --------------------------------------------------------------------------- measurements (workers)

def _rnn_flops(input_shape, weight_shapes) -> int:
    """Fused RNN kernels: every weight matrix is applied once to every token."""
    tokens = math.prod(input_shape[:-1])  # [T, B, I], or packed [Σ batch_sizes, I]
    return 2 * tokens * sum(w[0] * w[1] for w in weight_shapes if len(w) == 2)


def _sdpa_backward_flops(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    """Model FLOPs: twice the forward's, as for the explicit matmuls (fused kernels that
    recompute QKᵀ do more work, which torch's own formulas count)."""
    return 2 * sdpa_flop_count(query, key, value)


_aten = torch.ops.aten
# Added to torch's FlopCounterMode: CPU fused attention and fused RNNs (uncounted otherwise), and
# the attention backward kernels at model FLOPs, so the fused and explicit paths count the same.
EXTRA_FLOP_FORMULAS = {
    _aten._scaled_dot_product_flash_attention_for_cpu:
        lambda q, k, v, *a, out_shape=None, **kw: sdpa_flop_count(q, k, v),
    **{op: _sdpa_backward_flops for op in (
        _aten._scaled_dot_product_flash_attention_for_cpu_backward,
        _aten._scaled_dot_product_flash_attention_backward,
        _aten._scaled_dot_product_efficient_attention_backward,
        _aten._scaled_dot_product_cudnn_attention_backward)},
    _aten.mkldnn_rnn_layer: lambda x, w_ih, w_hh, *a, out_shape=None, **kw: _rnn_flops(x, [w_ih, w_hh]),
    _aten.mkldnn_rnn_layer_backward:
        lambda x, w_ih, w_hh, *a, out_shape=None, **kw: 2 * _rnn_flops(x, [w_ih, w_hh]),
    _aten._cudnn_rnn: lambda x, weights, *a, out_shape=None, **kw: _rnn_flops(x, weights),
    _aten._cudnn_rnn_backward: lambda x, weights, *a, out_shape=None, **kw: 2 * _rnn_flops(x, weights),
}


def _synchronize(device: str):
    if device == "cuda":
        torch.cuda.synchronize()


def _precision_context(job):
    """bf16 runs the forward under torch.autocast (fp32 weights and optimizer): fairseq's own
    --bf16 assumes a TPU (see ../shared/notes/fairseq-on-this-machine.md)."""
    if job["precision"] == "bf16":
        return torch.autocast(device_type=job["device"], dtype=torch.bfloat16)
    return nullcontext()


def _memory(device: str) -> dict:
    peak = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if device == "cuda":
        peak["cuda_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return peak


def _check_device(device: str, precision: str):
    if device == "cuda" and not torch.cuda.is_available():
        raise PluginError("--device cuda: no CUDA device is available (torch.cuda.is_available() is False)")
    if device == "cuda" and precision == "bf16" and not torch.cuda.is_bf16_supported():
        raise PluginError(f"--bf16: {torch.cuda.get_device_name()} has no bf16 support")


def measure_matmul_ceiling(job) -> dict:
    """FLOP/s of one large square matmul per precision: the fastest of the runs in ~1 s."""
    device = job["device"]
    _check_device(device, job["precision"])
    n = 8192 if device == "cuda" else 2048
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    if device == "cuda":
        dtypes["fp16"] = torch.float16
    ceilings = {}
    for name, dtype in dtypes.items():
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        a @ b  # warm-up
        times = []
        while len(times) < 3 or (sum(times) < 1.0 and len(times) < 50):
            _synchronize(device)
            start = time.perf_counter()
            a @ b
            _synchronize(device)
            times.append(time.perf_counter() - start)
        ceilings[name] = 2 * n**3 / min(times)
    info = {"ceilings": ceilings, "threads": torch.get_num_threads()}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


def _build_trainer(train_argv: List[str]):
    args = options.parse_args_and_arch(options.get_training_parser(), train_argv)
    cfg = convert_namespace_to_omegaconf(args)
    np.random.seed(cfg.common.seed)  # as fairseq-train does before building anything
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    trainer = Trainer(cfg, task, model, criterion)
    return trainer


def _batches(trainer):
    """fairseq-train's batches, epoch after epoch."""
    epoch_itr = trainer.get_train_iterator(epoch=1)
    while True:
        trainer.begin_epoch(epoch_itr.epoch)
        yield from epoch_itr.next_epoch_itr(shuffle=True)
        epoch_itr = trainer.get_train_iterator(epoch_itr.next_epoch_idx)


def measure_training(job) -> dict:
    """Target tokens/s of Trainer.train_step over job["updates"] updates after warm-up."""
    device = job["device"]
    _check_device(device, job["precision"])
    trainer = _build_trainer(job["train_argv"])
    batches = _batches(trainer)
    with _precision_context(job):
        for _ in range(job["warmup"]):
            trainer.train_step([next(batches)])
        sample = next(batches)  # one more untimed update, its FLOPs counted (warm, so like the timed ones)
        with FlopCounterMode(display=False, custom_mapping=EXTRA_FLOP_FORMULAS) as flop_counter:
            trainer.train_step([sample])
        flops_per_token = flop_counter.get_total_flops() / sample["ntokens"]
        tokens = updates = 0
        _synchronize(device)
        start = time.perf_counter()
        while updates < job["updates"] and (updates == 0 or time.time() < job["deadline"]):
            sample = next(batches)
            trainer.train_step([sample])
            tokens += sample["ntokens"]
            updates += 1
        _synchronize(device)
        seconds = time.perf_counter() - start
    if job.get("save"):
        state = {k: v.detach().float().cpu() for k, v in trainer.model.state_dict().items()}
        torch.save(state, job["save"])
    return {"updates": updates, "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
            "flops_per_token": flops_per_token, **_memory(device)}


def _generation_model(job, task):
    """The trained weights of job["weights"]; converted to vaswani_transformer if asked."""
    model_args = convert_namespace_to_omegaconf(
        options.parse_args_and_arch(options.get_training_parser(), job["train_argv"])).model
    state = torch.load(job["weights"], weights_only=True)
    if job["convert"]:
        with torch.device("meta"):  # fills in the options fairseq's build_model sets, as in a checkpoint
            task.build_model(model_args)
        model_args = convert_args(model_args)
        state = convert_state_dict(state, model_args)
    model = task.build_model(model_args)
    model.load_state_dict(state, strict=True)
    return model


def measure_generation(job) -> dict:
    """Sentences/s of beam search (fairseq's SequenceGenerator) over the first test batches."""
    device = job["device"]
    _check_device(device, job["precision"])
    cfg = convert_namespace_to_omegaconf(
        options.parse_args_and_arch(options.get_generation_parser(), job["gen_argv"]))
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    task.load_dataset(cfg.dataset.gen_subset)
    model = _generation_model(job, task)
    if cfg.common.fp16:
        model.half()
    model.to(device)
    model.prepare_for_inference_(cfg)  # as fairseq-generate does
    generator = task.build_generator([model], cfg.generation)
    itr = task.get_batch_iterator(
        dataset=task.dataset(cfg.dataset.gen_subset), max_tokens=cfg.dataset.max_tokens,
        max_sentences=cfg.dataset.batch_size,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        seed=cfg.common.seed, num_workers=0).next_epoch_itr(shuffle=False)
    batches = [utils.move_to_cuda(s) if device == "cuda" else s for s in itr]
    hypotheses, hyp_tokens, sentences = {}, 0, 0
    with torch.no_grad(), _precision_context(job):
        task.inference_step(generator, [model], batches[0])  # warm-up, untimed
        _synchronize(device)
        start = time.perf_counter()
        for sample in batches:
            if sentences >= job["sentences"] or (sentences and time.time() > job["deadline"]):
                break
            for sentence_id, hypos in zip(sample["id"].tolist(), task.inference_step(generator, [model], sample)):
                hypotheses[sentence_id] = hypos[0]["tokens"].tolist()
                hyp_tokens += len(hypotheses[sentence_id])
            sentences += sample["nsentences"]
        _synchronize(device)
        seconds = time.perf_counter() - start
    return {"sentences": sentences, "seconds": seconds, "sentences_per_s": sentences / seconds,
            "hyp_tokens_per_s": hyp_tokens / seconds, "hyp_tokens_per_sentence": hyp_tokens / sentences,
            "hypotheses": hypotheses, **_memory(device)}


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


# --------------------------------------------------------------------------- the run

def prepare_data(args, preset: dict, work_dir: str) -> str:
    """The synthetic corpus of the preset, preprocessed with a joined dictionary."""
    train, valid, test, min_len, max_len = preset["corpus"]
    raw, data = os.path.join(work_dir, "raw"), os.path.join(work_dir, "data-bin")
    for cmd in (
        [sys.executable, "-m", "fairseq_plugins.cli.make_corpus", "--out", raw, "--train", train, "--valid", valid,
         "--test", test, "--min-len", min_len, "--max-len", max_len, "--seed", 1],
        [sys.executable, "-m", "fairseq_cli.preprocess", "--source-lang", "src", "--target-lang", "tgt",
         "--trainpref", f"{raw}/train", "--validpref", f"{raw}/valid", "--testpref", f"{raw}/test",
         "--destdir", data, "--joined-dictionary", "--workers", 2]):
        proc = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0:
            raise PluginError(f"preparing the corpus failed: {' '.join(map(str, cmd[:3]))}: {proc.stdout[-500:]}")
    return data


def _dictionaries(data: str, args, need_test: bool = True) -> List[str]:
    if args.source_lang and args.target_lang:
        langs = [args.source_lang, args.target_lang]
    else:
        langs = sorted(n[len("dict."):-len(".txt")] for n in os.listdir(data)
                       if n.startswith("dict.") and n.endswith(".txt"))
    paths = [os.path.join(data, f"dict.{lang}.txt") for lang in langs]
    if len(paths) != 2 or not all(os.path.isfile(p) for p in paths):
        raise PluginError(f"--data {data}: expected fairseq-preprocess output with two dict.LANG.txt files "
                          "(pass --source-lang/--target-lang)")
    if need_test and not any(n.startswith("test.") for n in os.listdir(data)):
        raise PluginError(f"--data {data}: no test split (generation runs on it)")
    return paths


def _same_file(a: str, b: str) -> bool:
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


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
    budget = Budget(args.budget_minutes, 1 + len(runs) * 2 * args.repeats)
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
    table = {(pair, kind, model): [] for pair, kind in runs for model in MODELS}  # -> results of the repeats
    for repeat in range(args.repeats):
        for pair, kind in runs:
            order = MODELS if repeat % 2 == 0 else MODELS[::-1]
            for model in order:
                job = {**base_job, "label": f"{pair}/{model}", "deadline": budget.deadline(),
                       "train_argv": training_argv(args, flags[pair][model], work_dir)}
                if kind == "train":
                    job.update(warmup=args.warmup, updates=counts.get((pair, kind), args.updates))
                    if repeat == 0 and trained_by[(pair, model)] == model:
                        job["save"] = os.path.join(work_dir, f"{pair}-{model}.pt")
                    target = measure_training
                else:
                    convert = pair == "transformer" and model == "ours"
                    weights = os.path.join(work_dir, f"{pair}-{trained_by[(pair, model)]}.pt")
                    job.update(gen_argv=generation_argv(args), weights=weights, convert=convert,
                               sentences=counts.get((pair, kind), args.sentences))
                    if convert:
                        # the built-in's options and weights, converted in the worker
                        job["train_argv"] = training_argv(args, flags[pair]["theirs"], work_dir)
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
    report = format_report(args, preset, precision, machine, table, counts, time.time() - start)
    return report


def log(message: str):
    print(f"[benchmark] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- report

TARGETS = {  # on this project's 2-core CPU (issues 3 and 4): (ratio, "min" or "max")
    ("transformer", "train"): (1.15, "min"), ("transformer", "generate"): (1.3, "min"),
    ("transformer", "memory"): (1.0, "max"),
    ("rnnsearch", "train"): (1.0, "min"), ("rnnsearch", "generate"): (1.0, "min"),
}
PAIR_LABELS = {"transformer": ("vaswani_transformer", "transformer"), "rnnsearch": ("rnnsearch", "lstm")}


def _median(results: List[dict], key: str) -> float:
    return statistics.median(r[key] for r in results)


def _target(pair: str, what: str, ratio: float) -> str:
    if (pair, what) not in TARGETS:
        return ""
    bound, sense = TARGETS[(pair, what)]
    met = ratio >= bound if sense == "min" else ratio <= bound
    return f"{'≥' if sense == 'min' else '≤'} {bound:.2f}× {'✓' if met else '✗'}"


def _hypotheses_row(pair: str, table) -> List[str]:
    ours = table[(pair, "generate", "ours")][0]["hypotheses"]
    theirs = table[(pair, "generate", "theirs")][0]["hypotheses"]
    same = sum(ours[i] == theirs.get(i) for i in ours)
    identical = same == len(ours) == len(theirs)
    note = "same weights (converted)" if pair == "transformer" else "different models, not expected"
    return [pair, "hypotheses identical", f"{identical} ({same}/{len(ours)})", note, "", ""]


def format_report(args, preset, precision, machine, table, counts, seconds) -> str:
    ceiling = machine["ceilings"][precision]
    rows = []
    for pair in args.pairs:
        ours_name, theirs_name = PAIR_LABELS[pair]
        train = {m: table[(pair, "train", m)] for m in MODELS}
        gen = {m: table[(pair, "generate", m)] for m in MODELS}
        metrics = [
            ("train target tokens/s", train, "tokens_per_s", "train", "{:,.0f}"),
            ("generate sentences/s (beam 4)", gen, "sentences_per_s", "generate", "{:,.1f}"),
            ("generate hypothesis tokens/s", gen, "hyp_tokens_per_s", "", "{:,.0f}"),
            ("train peak RSS (MiB)", train, "peak_rss_mb", "memory", "{:,.0f}"),
            ("generate peak RSS (MiB)", gen, "peak_rss_mb", "memory", "{:,.0f}"),
        ]
        if args.device == "cuda":
            metrics += [("train peak CUDA memory (MiB)", train, "cuda_peak_mb", "memory", "{:,.0f}"),
                        ("generate peak CUDA memory (MiB)", gen, "cuda_peak_mb", "memory", "{:,.0f}")]
        for name, results, key, what, fmt in metrics:
            ours, theirs = _median(results["ours"], key), _median(results["theirs"], key)
            digits = 3 if what == "memory" else 2
            rows.append([pair, name, fmt.format(ours), fmt.format(theirs), f"{ours / theirs:.{digits}f}×",
                         _target(pair, what, ours / theirs)])
        model_flops = {m: _median(train[m], "flops_per_token") * _median(train[m], "tokens_per_s") for m in MODELS}
        rows.append([pair, f"train model GFLOP/s (% of {precision} matmul ceiling)",
                     *(f"{model_flops[m] / 1e9:,.1f} ({100 * model_flops[m] / ceiling:.1f}%)" for m in MODELS),
                     f"{model_flops['ours'] / model_flops['theirs']:.2f}×", ""])
        rows.append(_hypotheses_row(pair, table))
    header = ["pair", "measurement", "ours", "fairseq built-in", "ours / built-in", "target (this CPU)"]
    ceilings = ", ".join(f"{k} {v / 1e9:,.0f} GFLOP/s" for k, v in machine["ceilings"].items())
    details = []
    for (pair, kind, model), results in table.items():
        key = "tokens_per_s" if kind == "train" else "sentences_per_s"
        values = ", ".join(f"{r[key]:,.1f}" for r in results)
        extra = (f"; hypothesis length {results[0]['hyp_tokens_per_sentence']:.1f} tokens" if kind == "generate"
                 else f"; {_median(results, 'flops_per_token') / 1e6:.1f} MFLOP per target token")
        details.append(f"- {kind} {pair} {model} ({PAIR_LABELS[pair][MODELS.index(model)]}): {values}{extra}")
    report = [
        "# fairseq-plugins benchmark: ours vs fairseq's built-ins",
        "",
        *describe_run(args, seconds, f" (torch threads {machine['threads']}), GPU: {machine.get('gpu', 'none')}"),
        f"- settings: device {args.device}, precision {precision}"
        f"{' (torch.autocast, fp32 weights)' if precision == 'bf16' else ''}, preset {args.preset}, "
        f"data {args.data_label}, --max-tokens {args.max_tokens}, {args.warmup} warm-up + 1 FLOP-counting + "
        f"{counts[(args.pairs[0], 'train')]} timed updates, "
        f"{counts[(args.pairs[0], 'generate')]} test sentences at beam 4 (batch {args.gen_batch}, "
        f"length {args.min_len} to {MAX_LEN_A}·|x|+{MAX_LEN_B}), {args.repeats} repeats interleaved (medians)",
        f"- matmul ceiling: {ceilings}",
        "",
        *markdown_table(header, rows),
        "",
        "Per repeat (tokens/s or sentences/s):",
        "",
        *details,
        "",
    ]
    return "\n".join(report)


def markdown_table(header: List[str], rows: List[List[str]]) -> List[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def describe_run(args, seconds: float, hardware: str = "") -> List[str]:
    """The report's first lines: date, machine and its load, software, command."""
    return [
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}; run took {seconds / 60:.1f} min",
        f"- machine: {_cpu_model()}, {os.cpu_count()} cores{hardware}; {platform.platform()}; load average at "
        f"start/end {args.load_at_start:.1f}/{os.getloadavg()[0]:.1f} (other processes share the machine)",
        f"- software: Python {platform.python_version()}, torch {torch.__version__}, fairseq {fairseq.__version__}",
        f"- command: `{' '.join(sys.argv)}`",
    ]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


# --------------------------------------------------------------------------- command line

def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fairseq-plugins-benchmark",
        description="Training and generation throughput, peak memory and model FLOP/s of the suite's "
                    "vaswani_transformer and rnnsearch against fairseq's transformer and lstm, in one run.")
    parser.add_argument("--data", help="fairseq-preprocess output with a test split (default: the synthetic "
                                       "corpus of the preset, made in a temporary directory)")
    parser.add_argument("--source-lang", help="source language of --data (default: inferred)")
    parser.add_argument("--target-lang", help="target language of --data (default: inferred)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu",
                        help="model sizes and default lengths: tiny (tests), cpu (3+3 layers, d=256; "
                             "rnn 256/512), base and big (the papers' sizes, for GPUs)")
    parser.add_argument("--pairs", default=",".join(PAIR_NAMES),
                        help=f"comma-separated pairs to run, of {', '.join(PAIR_NAMES)} (default: both)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where to run (default: cpu)")
    precision = parser.add_mutually_exclusive_group()
    precision.add_argument("--fp16", action="store_true", help="fairseq's --fp16 (CUDA only)")
    precision.add_argument("--bf16", action="store_true",
                           help="bf16 through torch.autocast with fp32 weights (fairseq's --bf16 needs a TPU)")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per model, interleaved (default: 3)")
    parser.add_argument("--warmup", type=int, help="untimed updates before timing (default: per preset)")
    parser.add_argument("--updates", type=int, help="timed updates per training measurement (default: per preset)")
    parser.add_argument("--sentences", type=int, help="test sentences per generation measurement (default: per preset)")
    parser.add_argument("--gen-batch", type=int, help="sentences per generation batch (default: per preset)")
    parser.add_argument("--min-len", type=int,
                        help="shortest hypothesis (fairseq-generate's --min-len): the few updates a benchmark "
                             "trains leave models that stop after a few words (default: the shortest sentence "
                             "of the synthetic corpus; 1 with --data)")
    parser.add_argument("--max-tokens", type=int, help="training batch size in tokens (default: per preset, "
                                                       "4096 but for tiny)")
    parser.add_argument("--num-workers", type=int, default=0,
                        help="fairseq data-loading worker processes in training (default: 0, load in-process)")
    parser.add_argument("--threads", type=int,
                        help="torch CPU threads per measurement (default: torch's, one per core). On a machine "
                             "shared with other processes, fewer threads than cores avoid stalls at every "
                             "parallel region")
    parser.add_argument("--budget-minutes", type=float,
                        help="bound on the whole run; fewer updates/sentences when they would not fit "
                             "(default: per preset, 7 for base/big)")
    parser.add_argument("--out", help="also write the markdown report to this file")
    return parser


def parse_args(argv=None):
    parser = get_parser()
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset]
    for name, key in (("warmup", "warmup"), ("updates", "updates"), ("sentences", "sentences"),
                      ("gen_batch", "gen_batch"), ("max_tokens", "max_tokens"), ("budget_minutes", "budget")):
        if getattr(args, name) is None:
            setattr(args, name, preset[key])
    args.pairs = [p.strip() for p in args.pairs.split(",") if p.strip()]

    def error(message):
        parser.error(message)

    for pair in args.pairs:
        if pair not in PAIR_NAMES:
            error(f"--pairs: unknown pair {pair!r} (choose from {', '.join(PAIR_NAMES)})")
    if not args.pairs:
        error("--pairs: no pair given")
    check_run_args(args, parser, preset,
                   ("repeats", "warmup", "updates", "sentences", "gen_batch", "max_tokens", "min_len", "threads"))
    if args.num_workers < 0:
        error(f"--num-workers must be >= 0, got {args.num_workers}")
    if args.fp16 and args.device != "cuda":
        error("--fp16 needs --device cuda (fairseq's fp16 training does not run on CPU); use --bf16 on CPU")
    if args.min_len is None:
        args.min_len = 1 if args.data else preset["corpus"][3]
    return args


def check_run_args(args, parser: argparse.ArgumentParser, preset: dict, positive):
    """What this command and fairseq-plugins-benchmark-scale check alike (one-line errors), and
    what follows from it: ``lang_flags`` and ``data_label``."""
    for name in positive:
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.budget_minutes <= 0:
        parser.error(f"--budget-minutes must be positive, got {args.budget_minutes}")
    if args.data is not None and not os.path.isdir(args.data):
        parser.error(f"--data {args.data}: no such directory")
    if bool(args.source_lang) != bool(args.target_lang):
        parser.error("--source-lang and --target-lang go together")
    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        parser.error(f"--out {args.out}: its directory does not exist")
    args.lang_flags = ["--source-lang", args.source_lang, "--target-lang", args.target_lang] if args.source_lang else []
    train, _, test, min_len, max_len = preset["corpus"]
    args.data_label = (args.data if args.data else
                       f"synthetic corpus ({train} training pairs, {min_len}-{max_len} tokens, test {test})")


def main(argv=None):
    args = parse_args(argv)
    # measurements fork from this process: CUDA must not be initialised here, not even by an
    # availability check (torch's NVML-based check leaves the driver alone)
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    report_to_out(args, run, "fairseq-plugins-benchmark")


def report_to_out(args, make_report, prog: str):
    """Print ``make_report(args)`` and write it to ``--out``; a PluginError becomes one line."""
    try:
        report = make_report(args)
    except PluginError as e:
        sys.exit(f"{prog}: error: {e}")
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)
        log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
