"""``fairseq-generate`` against exported engines (CTranslate2, ONNX Runtime) on the same checkpoints and test set.

For each checkpoint and thread count: sentences/s of beam search over the whole test split
(median of interleaved repeats, after one untimed warm-up call per engine), by wall time and by
the process's CPU time (all its threads: on a machine shared with other jobs the CPU time of a
1-thread run is the measure that load does not distort), BLEU against the
split's references (sacrebleu, as binarized: unknown words are ``<unk>``) and how many
hypotheses equal fairseq's. fairseq decodes through ``task.build_generator`` (fairseq-generate's
SequenceGenerator, batches of ``--batch-size`` sentences by length), beam ``--beam``, length
penalty 1, ``--max-len``; one process, ``torch.set_num_threads`` for the threads; a suite model
also with its decoding options (``SUITE_DECODING``: ``--compile-decoding``, and with int8 linear layers). The engines
come from the exports of :data:`EXPORTS` (:mod:`fairseq_plugins_lab.benchmarks.ctranslate2`,
:mod:`fairseq_plugins_lab.benchmarks.onnx`): every command that times an engine goes through here,
``fairseq-plugins-benchmark engines`` on given checkpoints and ``models --onnx --ctranslate2`` on the
models it trained.
"""
import importlib
import os
import tempfile
import time
from argparse import Namespace
from dataclasses import dataclass
from typing import Callable, Dict, List, Sequence, Tuple

import torch
from fairseq import checkpoint_utils, options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from omegaconf import OmegaConf
from sacrebleu.metrics import BLEU

from fairseq_plugins.checkpoints import save_state
from fairseq_plugins.errors import ConfigError
from fairseq_plugins.export.common import read_checkpoint
from fairseq_plugins.modules.beam_cache import BeamCacheDecoder
from fairseq_plugins_lab.benchmarks.measure import generation_model
from fairseq_plugins_lab.benchmarks.report import describe_run, engine_table

# the suite's decoding options measured as engines of their own (rows of a suite model)
SUITE_DECODING = {
    "fairseq --compile-decoding": {"compile_decoding": True},
    "fairseq --compile-decoding --quantize-decoding int8": {"compile_decoding": True, "quantize_decoding": "int8"},
}
ENGINES_MAX_LEN = 200  # fairseq-generate's default --max-len-b, where --max-len does not fix one


@dataclass(frozen=True)
class Export:
    """An engine family timed against fairseq-generate. Its module has ``engines(checkpoint, args,
    work_dir, sources)`` ({engine name: threads -> a call translating ``sources``}) and
    ``check_exportable(state, checkpoint)`` (the exporter's refusals)."""
    label: str  # in the report's title
    module: str
    needs: Tuple[str, ...]  # what the module imports, from the pip extra ``extra``
    extra: str


# --engine's choices, models' --onnx and --ctranslate2: CTranslate2 takes vaswani_transformer, ONNX any family
EXPORTS = {
    "onnx": Export("ONNX Runtime", "fairseq_plugins_lab.benchmarks.onnx", ("onnxruntime", "onnxscript"), "onnx"),
    "ctranslate2": Export("CTranslate2", "fairseq_plugins_lab.benchmarks.ctranslate2", ("ctranslate2",), "deploy"),
}


def load_export(name: str, flag: str):
    """The module of ``EXPORTS[name]``, imported only now; one line naming ``flag`` and the pip extra
    when what it needs is not installed."""
    export = EXPORTS[name]
    try:
        for module in export.needs:
            importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"{flag}: {e.name} is not installed; pip install 'fairseq-plugins[{export.extra}]'") from None
    return importlib.import_module(export.module)


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


def _prepared(checkpoint: str, args, **generation):
    """The model and task of ``checkpoint`` as fairseq-generate prepares them (``prepare_for_inference_``)
    with the generation options ``generation`` (e.g. ``compile_decoding=True``)."""
    [model], cfg, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint],
                                                                       arg_overrides={"data": args.data})
    cfg.generation.beam = args.beam
    for name, value in generation.items():
        setattr(cfg.generation, name, value)
    model.eval().prepare_for_inference_(cfg)
    return model, task


def engine(open_translator: Callable, translate: Callable) -> Callable:
    """threads -> a call translating the split with a translator opened once for that many threads."""
    def for_threads(threads: int) -> Callable[[], List[str]]:
        translator = open_translator(threads)
        return lambda: translate(translator)
    return for_threads


def measure_checkpoint(checkpoint: str, args, work_dir: str, exports: Sequence[Callable]) -> List[Dict]:
    """Rows {checkpoint, threads, engine, sentences_per_s: [...], bleu, identical} of one model:
    fairseq-generate and the engines of each of ``exports`` (the ``engines`` functions of :data:`EXPORTS`)."""
    model, task = _prepared(checkpoint, args)
    fairseq = {"fairseq": model}
    if isinstance(model.decoder, BeamCacheDecoder):  # a suite model: also with its decoding options
        for name, options in SUITE_DECODING.items():
            fairseq[name] = _prepared(checkpoint, args, **options)[0]
    dataset, sources, references = _test_split(task, args.subset)
    made = {name: make for engines in exports for name, make in engines(checkpoint, args, work_dir, sources).items()}
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        engines = {name: lambda model=model: _fairseq(model, task, dataset, args) for name, model in fairseq.items()}
        engines.update({name: make(threads) for name, make in made.items()})
        rows += time_engines(engines, checkpoint, threads, references, args.repeats)
    return rows


def measure_trained(job) -> dict:
    """``fairseq-plugins-benchmark models --onnx``/``--ctranslate2``: the suite's model of a pair as its
    generation rows decode it (the built-in Transformer's weights converted), written as a
    checkpoint, then :func:`measure_checkpoint` with ``job["exports"]`` on the test split with the
    settings in ``job["engines"]``."""
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
    rows = measure_checkpoint(checkpoint, Namespace(**job["engines"]), job["work_dir"], job["exports"])
    return {"rows": [{**row, "max_len": job["engines"]["max_len"]} for row in rows]}


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


def run(args, exports: Dict[str, object]) -> str:
    """The report of :func:`measure_checkpoint` with ``exports`` ({name in :data:`EXPORTS`: its module,
    from :func:`load_export`}) on every checkpoint. Every checkpoint is read and passed to each
    export's ``check_exportable`` first, so a checkpoint an engine cannot take is refused before
    anything is measured."""
    for checkpoint in args.checkpoints:
        state = read_checkpoint(checkpoint)
        for export in exports.values():
            export.check_exportable(state, checkpoint)
    args.load_at_start = os.getloadavg()[0]
    start = time.time()
    with tempfile.TemporaryDirectory() as work_dir:
        rows = [row for checkpoint in args.checkpoints
                for row in measure_checkpoint(checkpoint, args, work_dir, [e.engines for e in exports.values()])]
    engine = " and ".join(EXPORTS[name].label for name in exports)
    lines = [f"# fairseq-generate vs {engine} (beam {args.beam}, max length {args.max_len}, "
             f"batches of {args.batch_size})", ""]
    lines += describe_run(args, time.time() - start) + ["", engine_table(rows)]
    return "\n".join(lines) + "\n"
