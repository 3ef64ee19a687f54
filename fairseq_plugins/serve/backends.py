"""What translates a batch: a checkpoint through fairseq's hub interface, a CTranslate2 folder or an
ONNX folder.

Both take source subword tokens and return, per sentence, its ``n_best`` hypotheses: target
tokens (without ``</s>``), score (the log-probability divided by the length counting ``</s>``,
natural log, as fairseq's generator and CTranslate2 with ``length_penalty=1`` give it) and, when
asked, the attention of each target token over the source tokens (``</s>`` of either side left
out, as CTranslate2 returns it; a row sums to at most 1): RNNsearch's α, the Transformer's
``--alignment-layer`` averaged over heads.
"""
import json
import logging
import os
from argparse import Namespace
from dataclasses import dataclass
from typing import List, Optional

from fairseq_plugins.errors import CheckpointError, ConfigError
from fairseq_plugins.serve.text import TextPipeline

MAX_DECODING_LENGTH = 200  # fairseq-generate's default --max-len-b, with --max-len-a 0


@dataclass(frozen=True)
class Options:
    """The per-request decoding options; requests are batched together only when they are equal."""
    beam: int = 4
    n_best: int = 1
    alignment: bool = False


@dataclass
class Hypothesis:
    tokens: List[str]
    score: float
    alignment: Optional[List[List[float]]] = None  # [len(tokens)][len(source tokens)]


class HubBackend:
    """A checkpoint of any family, loaded and decoded by fairseq's ``GeneratorHubInterface``."""

    kind = "fairseq"

    def __init__(self, checkpoint: str, data: Optional[str], text_options: Namespace, threads: int):
        import torch
        from fairseq import checkpoint_utils
        from fairseq.hub_utils import GeneratorHubInterface
        from fairseq.models import ARCH_MODEL_NAME_REGISTRY
        from omegaconf import open_dict

        from fairseq_plugins.checkpoints import load_state

        if not os.path.isfile(checkpoint):
            raise CheckpointError(f"MODEL {checkpoint}: neither a checkpoint file nor a CTranslate2 or ONNX folder")
        torch.set_num_threads(threads)  # intra-op threads, shared by the workers
        state = load_state(checkpoint)
        data = data or state["cfg"]["task"]["data"]
        if not os.path.isdir(data):
            raise ConfigError(f"data directory {data} (with the dictionaries of {checkpoint}) does not exist; "
                              "pass --data DIR")
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
            [checkpoint], arg_overrides={"data": data}, state=state)
        with open_dict(cfg):
            cfg.dataset.batch_size, cfg.dataset.max_tokens = None, 10 ** 9  # the batcher sizes batches
            cfg.generation.max_len_a, cfg.generation.max_len_b = 0, MAX_DECODING_LENGTH
        # Attention is always computed, so that requests with and without alignments can be decoded
        # at once by several workers: fairseq's own switch (what --print-alignment sets), applied
        # before the hub's prepare_for_inference_, which then leaves the model as it is.
        models[0].make_generation_fast_(need_attn=True)
        self.hub = GeneratorHubInterface(cfg, task, models).eval()
        logging.getLogger("fairseq.tasks.fairseq_task").setLevel(logging.WARNING)  # 4 lines per generate()
        arch = getattr(cfg.model, "arch", None) or cfg.model._name
        self.family = ARCH_MODEL_NAME_REGISTRY.get(arch, arch)
        self.arch = arch
        self.text = (TextPipeline.from_options(text_options) if text_options.tokenizer or text_options.bpe
                     else TextPipeline(self.hub.tokenizer, self.hub.bpe,
                                       {"tokenizer": cfg.tokenizer and cfg.tokenizer._name,
                                        "bpe": cfg.bpe and cfg.bpe._name}))
        self.vocabulary = {"source": len(task.source_dictionary), "target": len(task.target_dictionary)}
        # RNNencdec and the seq2seq LSTM have no attention; translating the empty source (</s>
        # alone, which also warms the model up) tells, whatever the family
        empty = self.hub.src_dict.encode_line("", add_if_not_exist=False, append_eos=True).long()
        probe = self.hub.generate([empty], beam=1)[0][0]
        self.has_attention = probe["attention"] is not None and probe["attention"].numel() > 0

    def translate(self, sources: List[List[str]], options: Options) -> List[List[Hypothesis]]:
        src_dict, tgt_dict = self.hub.src_dict, self.hub.tgt_dict
        encoded = [src_dict.encode_line(" ".join(tokens), add_if_not_exist=False, append_eos=True).long()
                   for tokens in sources]
        results = self.hub.generate(encoded, beam=options.beam, nbest=options.n_best)
        out = []
        for tokens, hypos in zip(sources, results):
            n = len(tokens) + 1  # with </s>
            sentence = []
            for hypo in hypos[:options.n_best]:
                ids = hypo["tokens"].tolist()[:-1]  # without </s>
                alignment = None
                if options.alignment:
                    # [padded source length, target length + 1]; the hub's inference dataset pads
                    # sources on the left (LanguagePairDataset's default, whatever the task's flag)
                    attention = hypo["attention"][-n:]
                    alignment = attention[:-1, :-1].t().tolist()
                sentence.append(Hypothesis([tgt_dict[i] for i in ids], hypo["score"].item(), alignment))
            out.append(sentence)
        return out


class CTranslate2Backend:
    """A ``vaswani_transformer`` written by ``fairseq-plugins-export-ctranslate2`` (fp32 or int8)."""

    kind = "ctranslate2"
    family = arch = "vaswani_transformer"
    has_attention = True

    def __init__(self, folder: str, text_options: Namespace, workers: int, threads: int):
        import ctranslate2

        self.translator = ctranslate2.Translator(folder, device="cpu", inter_threads=workers,
                                                 intra_threads=threads)
        self.text = TextPipeline.from_options(text_options)
        vocabularies = {}
        for side in ("source", "target"):
            for name in (f"{side}_vocabulary.json", "shared_vocabulary.json"):
                path = os.path.join(folder, name)
                if os.path.isfile(path):
                    with open(path, encoding="utf-8") as f:
                        vocabularies[side] = len(json.load(f))
                    break
        self.vocabulary = vocabularies
        self.compute_type = self.translator.compute_type

    def translate(self, sources: List[List[str]], options: Options) -> List[List[Hypothesis]]:
        kwargs = dict(beam_size=options.beam, num_hypotheses=options.n_best, return_scores=True,
                      max_decoding_length=MAX_DECODING_LENGTH)
        if options.alignment:
            # CTranslate2 4.8.5 returns the first sentence's first-step attention for every sentence
            # of a batched beam search: one sentence per call when the attention is asked for.
            results = [self.translator.translate_batch([s], return_attention=True, **kwargs)[0] for s in sources]
        else:
            results = self.translator.translate_batch(sources, **kwargs)
        return [[Hypothesis(list(tokens), score, result.attention[k] if options.alignment else None)
                 for k, (tokens, score) in enumerate(zip(result.hypotheses, result.scores))]
                for result in results]


class OnnxBackend:
    """A folder written by ``fairseq-plugins-export-onnx`` (any family, fp32 or int8), decoded by its
    runtime :mod:`fairseq_plugins_onnx` (fairseq's beam search over two ONNX Runtime sessions)."""

    kind = "onnx"

    def __init__(self, folder: str, text_options: Namespace, threads: int):
        from fairseq_plugins_onnx import Translator

        self.translator = Translator(folder, threads)
        config = self.translator.config
        self.family, self.arch, self.has_attention = config["family"], config["arch"], config["attention"]
        self.compute_type = config["quantization"] or "float32"
        self.vocabulary = {"source": len(self.translator.source_vocabulary),
                           "target": len(self.translator.target_vocabulary)}
        if not (text_options.tokenizer or text_options.bpe):  # the folder's own preprocessing
            pre = config["preprocessing"]
            text_options = Namespace(**{**vars(text_options), "tokenizer": pre["tokenizer"], "bpe": pre["bpe"],
                                        "source_lang": pre["source_lang"], "target_lang": pre["target_lang"],
                                        **{key: os.path.join(folder, pre[key]) for key in ("bpe_codes", "sentencepiece_model")
                                           if pre[key]}})
        self.text = TextPipeline.from_options(text_options)

    def translate(self, sources: List[List[str]], options: Options) -> List[List[Hypothesis]]:
        results = self.translator.translate(sources, beam=options.beam, n_best=options.n_best)
        return [[Hypothesis(h.tokens, h.score, [row[:-1] for row in h.attention[:-1]] if options.alignment else None)
                 for h in hypos] for hypos in results]


def load_backend(model: str, data: Optional[str], text_options: Namespace, workers: int, threads: int):
    """An ONNX folder (it holds ``decoder_step.onnx``), a CTranslate2 folder (``model.bin``) or a
    fairseq checkpoint file."""
    if os.path.isdir(model):
        if os.path.isfile(os.path.join(model, "decoder_step.onnx")):
            return OnnxBackend(model, text_options, threads)
        if not os.path.isfile(os.path.join(model, "model.bin")):
            raise ConfigError(f"MODEL {model} is a folder without model.bin or decoder_step.onnx: neither a "
                              "CTranslate2 nor an ONNX model")
        return CTranslate2Backend(model, text_options, workers, threads)
    return HubBackend(model, data, text_options, threads)
