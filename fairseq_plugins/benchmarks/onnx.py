"""``fairseq-generate`` against the ONNX Runtime folder (float32, int8) on the same checkpoints and test set.

As :mod:`fairseq_plugins.benchmarks.ctranslate2` (same rows, same timing: sentences per second
and per CPU-second, interleaved repeats, BLEU, hypotheses equal to fairseq's), with the engines
``onnx float32`` and ``onnx int8``: folders written by ``fairseq-plugins-export-onnx`` (any family),
decoded by :class:`fairseq_plugins_onnx.Translator` with one ONNX Runtime thread per ``--threads``.
"""
import os
from typing import Dict, List

import torch
from fairseq import checkpoint_utils

from fairseq_plugins.benchmarks.ctranslate2 import _fairseq, _test_split, time_engines
from fairseq_plugins.export.onnx import export

ENGINES = ("fairseq", "onnx float32", "onnx int8")


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
