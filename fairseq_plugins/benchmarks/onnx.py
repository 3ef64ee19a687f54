"""``fairseq-generate`` against the ONNX Runtime folder (float32, int8) on the same checkpoints and test set.

As :mod:`fairseq_plugins.benchmarks.engines` times them (same rows, same timing: sentences per second
and per CPU-second, interleaved repeats, BLEU, hypotheses equal to fairseq's), with the engines
``onnx float32`` and ``onnx int8``: folders written by ``fairseq-plugins-export-onnx`` (any family),
decoded by :class:`fairseq_plugins_onnx.Translator` with one ONNX Runtime thread per ``--threads``.
"""
import os
import tempfile
from argparse import Namespace
from typing import Callable, Dict, List

from fairseq import options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from omegaconf import OmegaConf

from fairseq_plugins.benchmarks.engines import engine, measure_checkpoint
from fairseq_plugins.benchmarks.measure import generation_model
from fairseq_plugins.checkpoints import save_state
from fairseq_plugins.export.onnx import export

ONNX_MAX_LEN = 200  # fairseq-generate's default --max-len-b, where --max-len does not fix one


def onnx_engines(checkpoint: str, args, work_dir: str, sources: List[str]) -> Dict[str, Callable]:
    """{engine name: threads -> a call translating ``sources``}: float32 and int8 folders."""
    from fairseq_plugins_onnx import Translator

    tokens = [s.split() for s in sources]
    engines = {}
    for quantization in ("float32", "int8"):
        path = tempfile.mkdtemp(prefix=f"onnx-{quantization}-", dir=work_dir)  # one per checkpoint
        export(checkpoint, path, data=args.data, force=True, beam=args.beam, max_len_b=args.max_len,
               quantize=None if quantization == "float32" else quantization)
        engines[f"onnx {quantization}"] = engine(
            lambda threads, path=path: Translator(path, threads),
            lambda translator: [" ".join(h[0].tokens) for h in translator.translate(
                tokens, beam=args.beam, max_len_b=args.max_len, batch_size=args.batch_size)])
    return engines


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
    rows = measure_checkpoint(checkpoint, Namespace(**job["onnx"]), job["work_dir"], [onnx_engines])
    return {"rows": [{**row, "max_len": job["onnx"]["max_len"]} for row in rows]}
