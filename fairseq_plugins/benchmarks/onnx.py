"""``fairseq-generate`` against the ONNX Runtime folder (float32, int8) on the same checkpoints and test set.

As :mod:`fairseq_plugins.benchmarks.ctranslate2` (same rows, same timing: sentences per second
and per CPU-second, interleaved repeats, BLEU, hypotheses equal to fairseq's), with the engines
``onnx float32`` and ``onnx int8``: folders written by ``fairseq-plugins-export-onnx`` (any family),
decoded by :class:`fairseq_plugins_onnx.Translator` with one ONNX Runtime thread per ``--threads``.
"""
import os
from argparse import Namespace
from typing import Dict, List

import torch
from fairseq import checkpoint_utils, options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from omegaconf import OmegaConf

from fairseq_plugins.benchmarks.ctranslate2 import _fairseq, _test_split, time_engines
from fairseq_plugins.benchmarks.measure import generation_model
from fairseq_plugins.checkpoints import save_state
from fairseq_plugins.export.onnx import export

ENGINES = ("fairseq", "onnx float32", "onnx int8")
ONNX_MAX_LEN = 200  # fairseq-generate's default --max-len-b, where --max-len does not fix one


def measure_checkpoint(checkpoint: str, args, work_dir: str) -> List[Dict]:
    from fairseq_plugins_onnx import Translator

    [model], _, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides={"data": args.data})
    model.eval()
    dataset, sources, references = _test_split(task, args.subset)
    dirs = {}
    for quantization in ("float32", "int8"):
        dirs[quantization] = os.path.join(work_dir, f"{os.path.basename(os.path.dirname(checkpoint))}-{quantization}")
        export(checkpoint, dirs[quantization], data=args.data, force=True, beam=args.beam, max_len_b=args.max_len,
               quantize=None if quantization == "float32" else quantization)
    tokens = [s.split() for s in sources]
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        engines = {"fairseq": lambda: _fairseq(model, task, dataset, args)}
        for quantization, path in dirs.items():
            translator = Translator(path, threads)
            engines[f"onnx {quantization}"] = (lambda t: lambda: [
                " ".join(h[0].tokens) for h in t.translate(tokens, beam=args.beam, max_len_b=args.max_len,
                                                           batch_size=args.batch_size)])(translator)
        rows += time_engines(engines, checkpoint, threads, references, args.repeats)
    return rows


def measure_trained(job) -> dict:
    """``fairseq-plugins-benchmark --onnx``: the suite's model of a pair as its generation rows decode
    it (the built-in Transformer's weights converted), written as a checkpoint, then
    :func:`measure_checkpoint` on the test split with the settings in ``job["onnx"]``."""
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), job["train_argv"]))
    model, model_args = generation_model(job, tasks.setup_task(cfg.task))
    checkpoint = os.path.join(job["work_dir"], job["pair"], "checkpoint.pt")
    os.makedirs(os.path.dirname(checkpoint), exist_ok=True)
    state_cfg = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    state_cfg["model"] = model_args if isinstance(model_args, Namespace) else \
        OmegaConf.to_container(model_args, resolve=True, enum_to_str=True)
    history = {"criterion_name": cfg.criterion._name, "optimizer_name": cfg.optimizer._name,
               "lr_scheduler_state": {}, "num_updates": 0}  # what fairseq's loader reads
    save_state({"cfg": state_cfg, "model": model.state_dict(), "optimizer_history": [history],
                "extra_state": {"train_iterator": None}}, checkpoint)
    rows = measure_checkpoint(checkpoint, Namespace(**job["onnx"]), job["work_dir"])
    return {"rows": [{**row, "max_len": job["onnx"]["max_len"]} for row in rows]}
