"""CTranslate2 (float32, int8) exports of a ``vaswani_transformer`` checkpoint as benchmark engines.

:func:`engines` is the export ``ctranslate2`` of :data:`fairseq_plugins_lab.benchmarks.engines.EXPORTS`
(which times it against ``fairseq-generate``): each engine translates through
``Translator.translate_batch`` with ``max_batch_size`` ``--batch-size``, beam ``--beam``, length
penalty 1 and the same maximum length as fairseq, ``intra_threads`` for the threads.
"""
import tempfile
from typing import Callable, Dict, List

from fairseq_plugins.export.ctranslate2 import check_exportable, export  # noqa: F401  (check_exportable: EXPORTS')
from fairseq_plugins_lab.benchmarks.engines import engine


def _ctranslate2(translator, sources: List[str], args) -> List[str]:
    results = translator.translate_batch([s.split() for s in sources], beam_size=args.beam,
                                         max_batch_size=args.batch_size, max_decoding_length=args.max_len)
    return [" ".join(r.hypotheses[0]) for r in results]


def engines(checkpoint: str, args, work_dir: str, sources: List[str]) -> Dict[str, Callable]:
    """{engine name: threads -> a call translating ``sources``}: CTranslate2 float32 and int8 exports."""
    import ctranslate2

    made = {}
    for quantization in ("float32", "int8"):
        path = tempfile.mkdtemp(prefix=f"ctranslate2-{quantization}-", dir=work_dir)  # one per checkpoint
        export(checkpoint, path, None if quantization == "float32" else quantization, force=True, data=args.data)
        made[f"ctranslate2 {quantization}"] = engine(
            lambda threads, path=path: ctranslate2.Translator(path, device="cpu", inter_threads=1,
                                                              intra_threads=threads),
            lambda translator: _ctranslate2(translator, sources, args))
    return made
