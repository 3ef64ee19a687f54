"""The measurements, each run in a fresh process (:func:`fairseq_plugins_lab.benchmarks.harness.in_fresh_process`).

* training: target tokens/s of fairseq's own ``Trainer.train_step`` (data loading included,
  as in ``fairseq-train``) over a fixed number of updates after warm-up updates;
* generation: sentences/s of beam search through ``task.build_generator`` (fairseq's
  SequenceGenerator) on the test split, after one untimed batch. Our transformer decodes with
  the built-in's trained weights converted by :mod:`fairseq_plugins.models.transformer_convert`,
  and the hypotheses of the two are compared;
* peak memory: the process's RSS high-water mark (``ru_maxrss``), and on CUDA
  ``torch.cuda.max_memory_allocated``;
* model FLOP/s: matmul/attention FLOPs of forward+backward per target token, counted by
  ``torch.utils.flop_counter`` on one more untimed update after the warm-up, times the
  measured tokens/s, against the matmul ceiling (:func:`measure_matmul_ceiling`, one large
  matmul per precision, by the fastest of torch's kernels for it).
"""
import resource
import time
from contextlib import nullcontext
from typing import List

import numpy as np
import torch
from fairseq import options, tasks, utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.trainer import Trainer
from torch.utils.flop_counter import FlopCounterMode

from fairseq_plugins.errors import PluginError
from fairseq_plugins.hardware import native_bf16
from fairseq_plugins.models.transformer_convert import convert_args, convert_state_dict
from fairseq_plugins.modules.decoding_linear import PrepackedLinear, prepacking_available
from fairseq_plugins_lab.benchmarks.flops import EXTRA_FLOP_FORMULAS, count_scan_steps


def _synchronize(device: str):
    if device == "cuda":
        torch.cuda.synchronize()


def _precision_context(job):
    """bf16 runs the forward under torch.autocast (fp32 weights and optimizer): fairseq's own
    --bf16 assumes a TPU (see docs/FAIRSEQ_NOTES.md)."""
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
    if precision == "bf16" and not native_bf16(device):
        raise PluginError(f"--bf16: this {device} device has no native bfloat16 support (emulated, it is many "
                          "times slower than fp32); benchmark fp32")


def _square_matmuls(a, b):
    """The ways torch multiplies a by b: ``a @ b`` (MKL's sgemm on a CPU) and, for float32 on a
    CPU, oneDNN on a prepacked b (``--compile-decoding``'s linear layers), which runs twice as
    fast on some CPUs (docs/BENCHMARKS.md)."""
    kernels = {"matmul": lambda: a @ b}
    if a.device.type == "cpu" and a.dtype == torch.float32 and prepacking_available():
        linear = PrepackedLinear(b.size(0), b.size(1), bias=False)
        linear.weight.data = b.t().contiguous()
        kernels["oneDNN prepacked"] = lambda: linear(a)
    return kernels


def measure_matmul_ceiling(job) -> dict:
    """FLOP/s of one large square matmul per precision: the fastest of the runs in ~1 s of the
    fastest kernel. bf16 only where it is native (emulated, one such matmul takes minutes and
    says nothing)."""
    device = job["device"]
    _check_device(device, job["precision"])
    n = 8192 if device == "cuda" else 2048
    dtypes = {"fp32": torch.float32}
    if native_bf16(device):
        dtypes["bf16"] = torch.bfloat16
    if device == "cuda":
        dtypes["fp16"] = torch.float16
    ceilings, kernels = {}, {}
    for name, dtype in dtypes.items():
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        for kernel, multiply in _square_matmuls(a, b).items():
            with torch.no_grad():
                multiply()  # warm-up (and packing)
                times = []
                while len(times) < 3 or (sum(times) < 1.0 and len(times) < 50):
                    _synchronize(device)
                    start = time.perf_counter()
                    multiply()
                    _synchronize(device)
                    times.append(time.perf_counter() - start)
            kernels[f"{name} {kernel}"] = 2 * n**3 / min(times)
            ceilings[name] = max(ceilings.get(name, 0.0), kernels[f"{name} {kernel}"])
    info = {"ceilings": ceilings, "kernels": kernels, "threads": torch.get_num_threads()}
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


def generation_model(job, task):
    """(model, its options) of the trained weights of job["weights"]; converted to
    vaswani_transformer if asked."""
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
    return model, model_args


def measure_generation(job) -> dict:
    """Sentences/s of beam search (fairseq's SequenceGenerator) over the first test batches."""
    device = job["device"]
    _check_device(device, job["precision"])
    cfg = convert_namespace_to_omegaconf(
        options.parse_args_and_arch(options.get_generation_parser(), job["gen_argv"]))
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    task.load_dataset(cfg.dataset.gen_subset)
    model, _ = generation_model(job, task)
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
        start = time.perf_counter()
        task.inference_step(generator, [model], batches[0])  # warm-up (with --compile-decoding: compiling)
        _synchronize(device)
        first_batch_seconds = time.perf_counter() - start
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
        flops_per_sentence = None
        if job.get("count_flops", True):  # the first batch once more, its matmuls counted
            count_scan_steps()
            with FlopCounterMode(display=False, custom_mapping=EXTRA_FLOP_FORMULAS) as flop_counter:
                task.inference_step(generator, [model], batches[0])
            flops_per_sentence = flop_counter.get_total_flops() / batches[0]["nsentences"]
    return {"sentences": sentences, "seconds": seconds, "sentences_per_s": sentences / seconds,
            "flops_per_sentence": flops_per_sentence,
            "hyp_tokens_per_s": hyp_tokens / seconds, "hyp_tokens_per_sentence": hyp_tokens / sentences,
            "first_batch_seconds": first_batch_seconds,
            "hypotheses": hypotheses, **_memory(device)}
