"""``fairseq-generate`` against the ONNX Runtime folder (float32, int8) on the same checkpoints and test set.

The export ``onnx`` of :data:`fairseq_plugins_lab.benchmarks.engines.EXPORTS`, timed as every export is
(same rows, same timing: sentences per second and per CPU-second, interleaved repeats, BLEU,
hypotheses equal to fairseq's), with the engines
``onnx float32`` and ``onnx int8``: folders written by ``fairseq-plugins-export-onnx`` (any family),
decoded by :class:`fairseq_plugins_onnx.Translator` with one ONNX Runtime thread per ``--threads``.
"""
import tempfile
from typing import Callable, Dict, List

from fairseq_plugins.export.onnx import check_exportable, export  # noqa: F401  (check_exportable: EXPORTS')
from fairseq_plugins_lab.benchmarks.engines import engine


def engines(checkpoint: str, args, work_dir: str, sources: List[str]) -> Dict[str, Callable]:
    """{engine name: threads -> a call translating ``sources``}: float32 and int8 folders."""
    from fairseq_plugins_onnx import Translator

    tokens = [s.split() for s in sources]
    made = {}
    for quantization in ("float32", "int8"):
        path = tempfile.mkdtemp(prefix=f"onnx-{quantization}-", dir=work_dir)  # one per checkpoint
        export(checkpoint, path, data=args.data, force=True, beam=args.beam, max_len_b=args.max_len,
               quantize=None if quantization == "float32" else quantization)
        made[f"onnx {quantization}"] = engine(
            lambda threads, path=path: Translator(path, threads),
            lambda translator: [" ".join(h[0].tokens) for h in translator.translate(
                tokens, beam=args.beam, max_len_b=args.max_len, batch_size=args.batch_size)])
    return made
