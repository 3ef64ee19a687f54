"""``fairseq-generate`` against CTranslate2 (float32, int8) on the same checkpoints and test set.

For each checkpoint and thread count: sentences/s of beam search over the whole test split
(median of interleaved repeats, after one untimed warm-up call per engine), by wall time and by
the process's CPU time (all its threads: on a machine shared with other jobs the CPU time of a
1-thread run is the measure that load does not distort), BLEU against the
split's references (sacrebleu, as binarized: unknown words are ``<unk>``) and how many
hypotheses equal fairseq's. fairseq decodes through ``task.build_generator`` (fairseq-generate's
SequenceGenerator, batches of ``--batch-size`` sentences by length); CTranslate2 through
``Translator.translate_batch`` with ``max_batch_size`` the same. Both use beam 4, length
penalty 1 and the same maximum length; one process, ``torch.set_num_threads`` /
``intra_threads`` for the threads.
"""
import os
import statistics
import tempfile
import time
from argparse import Namespace
from typing import Callable, Dict, List

import torch
from fairseq import checkpoint_utils
from sacrebleu.metrics import BLEU

from fairseq_plugins.analysis.report import markdown_table
from fairseq_plugins.benchmarks.report import describe_run
from fairseq_plugins.export.ctranslate2 import export

def _test_split(task, subset: str):
    task.load_dataset(subset)
    dataset = task.dataset(subset)
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    sources = [src_dict.string(dataset.src[i][:-1]) for i in range(len(dataset))]  # without </s>
    references = [tgt_dict.string(dataset.tgt[i]) for i in range(len(dataset))]
    return dataset, sources, references


def _fairseq(model, task, dataset, args) -> List[str]:
    generator = task.build_generator([model], Namespace(beam=args.beam, max_len_a=0, max_len_b=args.max_len,
                                                        min_len=1, lenpen=1.0))
    batches = task.get_batch_iterator(dataset, max_sentences=args.batch_size,
                                      max_positions=model.max_positions()).next_epoch_itr(shuffle=False)
    hypotheses = {}
    with torch.no_grad():
        for sample in batches:
            for i, hypos in zip(sample["id"].tolist(), task.inference_step(generator, [model], sample)):
                hypotheses[i] = task.target_dictionary.string(hypos[0]["tokens"].int())
    return [hypotheses[i] for i in range(len(hypotheses))]


def _ctranslate2(translator, sources: List[str], args) -> List[str]:
    results = translator.translate_batch([s.split() for s in sources], beam_size=args.beam,
                                         max_batch_size=args.batch_size, max_decoding_length=args.max_len)
    return [" ".join(r.hypotheses[0]) for r in results]


def ctranslate2_engines(checkpoint: str, args, work_dir: str, sources: List[str]) -> Dict[str, Callable]:
    """{engine name: threads -> a call translating ``sources``}: CTranslate2 float32 and int8 exports."""
    import ctranslate2

    engines = {}
    for quantization in ("float32", "int8"):
        path = tempfile.mkdtemp(prefix=f"ctranslate2-{quantization}-", dir=work_dir)  # one per checkpoint
        export(checkpoint, path, None if quantization == "float32" else quantization, force=True, data=args.data)
        engines[f"ctranslate2 {quantization}"] = engine(
            lambda threads, path=path: ctranslate2.Translator(path, device="cpu", inter_threads=1,
                                                              intra_threads=threads),
            lambda translator: _ctranslate2(translator, sources, args))
    return engines


def engine(open_translator: Callable, translate: Callable) -> Callable:
    """threads -> a call translating the split with a translator opened once for that many threads."""
    def for_threads(threads: int) -> Callable[[], List[str]]:
        translator = open_translator(threads)
        return lambda: translate(translator)
    return for_threads


def measure_checkpoint(checkpoint: str, args, work_dir: str, exports=(ctranslate2_engines,)) -> List[Dict]:
    """Rows {checkpoint, threads, engine, sentences_per_s: [...], bleu, identical} of one model:
    fairseq-generate and the engines of each of ``exports`` (functions like :func:`ctranslate2_engines`)."""
    [model], _, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides={"data": args.data})
    model.eval()
    dataset, sources, references = _test_split(task, args.subset)
    made = {name: make for engines in exports for name, make in engines(checkpoint, args, work_dir, sources).items()}
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        engines = {"fairseq": lambda: _fairseq(model, task, dataset, args)}
        engines.update({name: make(threads) for name, make in made.items()})
        rows += time_engines(engines, checkpoint, threads, references, args.repeats)
    return rows


def time_engines(engines: Dict, checkpoint: str, threads: int, references: List[str], repeats: int) -> List[Dict]:
    """Rows of ``engines`` (name: a call translating the split; ``"fairseq"`` first), each run once
    untimed (warm-up, hypotheses), then ``repeats`` times interleaved."""
    wall: Dict[str, List[float]] = {name: [] for name in engines}
    cpu: Dict[str, List[float]] = {name: [] for name in engines}
    outputs = {name: run() for name, run in engines.items()}  # warm-up, and the hypotheses
    names = list(engines)
    for repeat in range(repeats):  # interleaved, a different engine first each time
        for name in names[repeat % len(names):] + names[:repeat % len(names)]:
            start, start_cpu = time.perf_counter(), time.process_time()  # CPU time: all threads
            engines[name]()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    rows = []
    for name in names:
        same = sum(a == b for a, b in zip(outputs[name], outputs["fairseq"]))
        rows.append({"checkpoint": checkpoint, "threads": threads, "engine": name,
                     "sentences_per_s": [len(references) / t for t in wall[name]],
                     "sentences_per_cpu_s": [len(references) / t for t in cpu[name]],
                     "bleu": BLEU().corpus_score(outputs[name], [references]).score,
                     "identical": f"{same}/{len(references)}"})
    return rows


def run(args, exports=(ctranslate2_engines,), engine: str = "CTranslate2") -> str:
    """The report of :func:`measure_checkpoint` with ``exports`` on every checkpoint."""
    args.load_at_start = os.getloadavg()[0]
    start = time.time()
    with tempfile.TemporaryDirectory() as work_dir:
        rows = [row for checkpoint in args.checkpoints for row in measure_checkpoint(checkpoint, args, work_dir, exports)]
    lines = [f"# fairseq-generate vs {engine} (beam {args.beam}, max length {args.max_len}, "
             f"batches of {args.batch_size})", ""]
    lines += describe_run(args, time.time() - start) + ["", engine_table(rows)]
    return "\n".join(lines) + "\n"


def engine_table(rows: List[Dict]) -> str:
    """The markdown table of :func:`time_engines`'s rows, each engine against fairseq's row of the
    same model and threads."""
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
