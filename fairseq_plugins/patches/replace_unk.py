"""``--replace-unk [DICT]``: UNK replacement from attention (Luong et al., 2015; Jean et al., 2015).

Each ``<unk>`` of a hypothesis becomes the source word it attends to most (hard alignment:
the argmax over the source words, EOS and padding excluded), or that word's entry in the
alignment dictionary DICT (lines ``source target``) when it has one. fairseq 0.12 fails in
every form; the fixes:

* binarized data: ``fairseq-generate`` asserts ``--dataset-impl raw``, because it reads the
  original source line. Here the source is the dictionary's string of the binarized tokens
  (what ``S-`` prints): source words inside the vocabulary are copied exactly, words outside
  it were stored as ``<unk>`` by fairseq-preprocess and stay ``<unk>``.
* ``--replace-unk`` without a file name: the flag's constant is ``'@@ '``, which fairseq opens
  as the dictionary's file name; it now means "copy the source word".
* no alignment: the plain generator leaves ``hypo["alignment"]`` empty (``IndexError``); the
  decoders are asked for attention during the generation (``need_attn`` as before afterwards)
  and the hard alignment is extracted from it.
* ``--print-alignment``: the alignment is a list of (source, target) word pairs, or of
  probability rows with ``soft`` (``TypeError``); both are read as such.
"""
import contextvars

import fairseq.utils as fairseq_utils
import fairseq_cli.generate
import torch
from fairseq.tasks import FairseqTask
from omegaconf import open_dict

from fairseq_plugins.errors import ConfigError
from fairseq_plugins.patches._mechanism import Patch, Target
from fairseq_plugins.patches.alignment_attention import attention_on

LOAD_ALIGN_DICT = Target(fairseq_utils, "load_align_dict", "replace_unk")
REPLACE_UNK = Target(fairseq_utils, "replace_unk", "hypo_str, src_str, alignment, align_dict, unk")
POST_PROCESS = Target(fairseq_utils, "post_process_prediction",
                      "hypo_tokens, src_str, alignment, align_dict, tgt_dict, remove_bpe, extra_symbols_to_ignore")
BUILD_GENERATOR = Target(FairseqTask, "build_generator",
                         "self, models, args, seq_gen_cls, extra_gen_cls_kwargs, prefix_allowed_tokens_fn")
INFERENCE_STEP = Target(FairseqTask, "inference_step", "self, generator, models, sample, prefix_tokens, constraints")
GENERATE_MAIN = Target(fairseq_cli.generate, "main", "cfg")

NO_FILE = "@@ "  # what fairseq's --replace-unk gives when no file name follows it
# The alignment dictionary of the fairseq-generate call in progress (this thread or task) that
# replaces UNKs on binarized data, where fairseq's own --replace-unk must be off.
_binarized_align_dict = contextvars.ContextVar("fairseq_plugins.replace_unk.align_dict", default=None)


def load_align_dict(replace_unk):
    if replace_unk == NO_FILE or replace_unk is True:
        return {}
    try:
        return LOAD_ALIGN_DICT(replace_unk)
    except (OSError, IndexError) as e:
        raise ConfigError(f"--replace-unk {replace_unk}: not a readable alignment dictionary "
                          f"(lines 'source target'): {e}") from None


def _source_word_of(alignment, length):
    """Target word index -> source word index, from any form of ``hypo["alignment"]``."""
    if isinstance(alignment, torch.Tensor):
        if alignment.dim() == 2:  # [(src, tgt)] pairs as a tensor
            alignment = alignment.tolist()
        else:
            return {t: int(s) for t, s in enumerate(alignment.tolist())}
    if alignment and isinstance(alignment[0][0], str):  # soft: one row of source probabilities per target token
        return {t: max(range(len(row) - 1), key=lambda s: float(row[s]))  # the last column is EOS
                for t, row in enumerate(alignment[:length]) if len(row) > 1}
    return {int(t): int(s) for s, t in alignment}


def replace_unk(hypo_str, src_str, alignment, align_dict, unk):
    words, source = hypo_str.split(), src_str.split()
    aligned = _source_word_of(alignment, len(words))
    for t, word in enumerate(words):
        if word == unk and t in aligned and aligned[t] < len(source):
            src_word = source[aligned[t]]
            words[t] = align_dict.get(src_word, src_word)
    return " ".join(words)


def post_process_prediction(hypo_tokens, src_str, alignment, align_dict, tgt_dict, *args, **kwargs):
    if align_dict is None:
        align_dict = _binarized_align_dict.get()
    return POST_PROCESS(hypo_tokens, src_str, alignment, align_dict, tgt_dict, *args, **kwargs)


def _replacing(args):
    return getattr(args, "replace_unk", None) is not None or _binarized_align_dict.get() is not None


def build_generator(self, models, args, *more, **kwargs):
    generator = BUILD_GENERATOR(self, models, args, *more, **kwargs)
    if _replacing(args):
        generator.unk_alignment = True
    return generator


def inference_step(self, generator, models, sample, *args, **kwargs):
    if not getattr(generator, "unk_alignment", False):
        return INFERENCE_STEP(self, generator, models, sample, *args, **kwargs)
    with attention_on(models):  # decoders that compute attention only on demand
        hypos = INFERENCE_STEP(self, generator, models, sample, *args, **kwargs)
    src_tokens = sample["net_input"]["src_tokens"]
    pad, eos = generator.pad, generator.eos
    for i, sentence in enumerate(hypos):
        for hypo in sentence:
            attention, alignment = hypo.get("attention"), hypo.get("alignment")
            empty = isinstance(alignment, torch.Tensor) and alignment.numel() == 0
            if empty and attention is not None and attention.numel() > 0:
                hypo["alignment"] = fairseq_utils.extract_hard_alignment(
                    attention.t().float().cpu(), src_tokens[i].cpu(), hypo["tokens"].cpu(), pad, eos)
    return hypos


def generate_main(cfg, *args, **kwargs):
    """On binarized data, run fairseq's generation with the replacement done here."""
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    if not hasattr(cfg, "generation"):
        cfg = convert_namespace_to_omegaconf(cfg)
    spec = cfg.generation.replace_unk
    if spec is None or cfg.dataset.dataset_impl == "raw":
        return GENERATE_MAIN(cfg, *args, **kwargs)
    token = _binarized_align_dict.set(load_align_dict(spec))
    with open_dict(cfg):
        cfg.generation.replace_unk = None  # fairseq's path for binarized data, S- from the dictionary
    try:
        return GENERATE_MAIN(cfg, *args, **kwargs)
    finally:
        _binarized_align_dict.reset(token)


PATCH = Patch(__name__, {LOAD_ALIGN_DICT: load_align_dict, REPLACE_UNK: replace_unk, POST_PROCESS: post_process_prediction,
                         BUILD_GENERATOR: build_generator, INFERENCE_STEP: inference_step,
                         GENERATE_MAIN: generate_main})
