"""``fairseq-generate`` against exported engines (CTranslate2, ONNX Runtime) on the same checkpoints and test set.

For each checkpoint and thread count: sentences/s of beam search over the whole test split
(median of interleaved repeats, after one untimed warm-up call per engine), by wall time and by
the process's CPU time (all its threads: on a machine shared with other jobs the CPU time of a
1-thread run is the measure that load does not distort), BLEU against the
split's references (sacrebleu, as binarized: unknown words are ``<unk>``) and how many
hypotheses equal fairseq's. fairseq decodes through ``task.build_generator`` (fairseq-generate's
SequenceGenerator, batches of ``--batch-size`` sentences by length), beam ``--beam``, length
penalty 1, ``--max-len``; one process, ``torch.set_num_threads`` for the threads. The engines
come from exports: functions like :func:`fairseq_plugins.benchmarks.ctranslate2.ctranslate2_engines`
and :func:`fairseq_plugins.benchmarks.onnx.onnx_engines`.
"""
import os
import tempfile
import time
from argparse import Namespace
from typing import Callable, Dict, List, Sequence

import torch
from fairseq import checkpoint_utils
from sacrebleu.metrics import BLEU

from fairseq_plugins.benchmarks.report import describe_run, engine_table


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


def engine(open_translator: Callable, translate: Callable) -> Callable:
    """threads -> a call translating the split with a translator opened once for that many threads."""
    def for_threads(threads: int) -> Callable[[], List[str]]:
        translator = open_translator(threads)
        return lambda: translate(translator)
    return for_threads


def measure_checkpoint(checkpoint: str, args, work_dir: str, exports: Sequence[Callable]) -> List[Dict]:
    """Rows {checkpoint, threads, engine, sentences_per_s: [...], bleu, identical} of one model:
    fairseq-generate and the engines of each of ``exports`` (functions like
    :func:`fairseq_plugins.benchmarks.ctranslate2.ctranslate2_engines`)."""
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


def run(args, exports: Sequence[Callable], engine: str) -> str:
    """The report of :func:`measure_checkpoint` with ``exports`` on every checkpoint."""
    args.load_at_start = os.getloadavg()[0]
    start = time.time()
    with tempfile.TemporaryDirectory() as work_dir:
        rows = [row for checkpoint in args.checkpoints for row in measure_checkpoint(checkpoint, args, work_dir, exports)]
    lines = [f"# fairseq-generate vs {engine} (beam {args.beam}, max length {args.max_len}, "
             f"batches of {args.batch_size})", ""]
    lines += describe_run(args, time.time() - start) + ["", engine_table(rows)]
    return "\n".join(lines) + "\n"
