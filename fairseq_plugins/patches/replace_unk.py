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
  decoders are asked for attention and the hard alignment is extracted from it.
* ``--print-alignment``: the alignment is a list of (source, target) word pairs, or of
  probability rows with ``soft`` (``TypeError``); both are read as such.
"""
import fairseq.utils as fairseq_utils
import fairseq_cli.generate
import torch
from fairseq.tasks import FairseqTask
from omegaconf import open_dict

from fairseq_plugins.errors import ConfigError

NO_FILE = "@@ "  # what fairseq's --replace-unk gives when no file name follows it
_fairseq = {"load_align_dict": fairseq_utils.load_align_dict, "replace_unk": fairseq_utils.replace_unk,
            "post_process_prediction": fairseq_utils.post_process_prediction,
            "build_generator": FairseqTask.build_generator, "inference_step": FairseqTask.inference_step,
            "generate_main": fairseq_cli.generate.main}
_binarized = {}  # "align_dict" while fairseq-generate runs --replace-unk on binarized data


def load_align_dict(replace_unk):
    if replace_unk == NO_FILE or replace_unk is True:
        return {}
    try:
        return _fairseq["load_align_dict"](replace_unk)
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
        align_dict = _binarized.get("align_dict")
    return _fairseq["post_process_prediction"](hypo_tokens, src_str, alignment, align_dict, tgt_dict,
                                               *args, **kwargs)


def _replacing(args):
    return getattr(args, "replace_unk", None) is not None or "align_dict" in _binarized


def build_generator(self, models, args, *more, **kwargs):
    generator = _fairseq["build_generator"](self, models, args, *more, **kwargs)
    if _replacing(args):
        for model in models:  # decoders that compute attention only on demand
            for module in model.modules():
                if hasattr(module, "need_attn"):
                    module.need_attn = True
        generator.unk_alignment = True
    return generator


def inference_step(self, generator, models, sample, *args, **kwargs):
    hypos = _fairseq["inference_step"](self, generator, models, sample, *args, **kwargs)
    if getattr(generator, "unk_alignment", False):
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
        return _fairseq["generate_main"](cfg, *args, **kwargs)
    _binarized["align_dict"] = load_align_dict(spec)
    with open_dict(cfg):
        cfg.generation.replace_unk = None  # fairseq's path for binarized data, S- from the dictionary
    try:
        return _fairseq["generate_main"](cfg, *args, **kwargs)
    finally:
        _binarized.clear()


def install():
    fairseq_utils.load_align_dict = load_align_dict
    fairseq_utils.replace_unk = replace_unk
    fairseq_utils.post_process_prediction = post_process_prediction
    FairseqTask.build_generator = build_generator
    FairseqTask.inference_step = inference_step
    fairseq_cli.generate.main = generate_main
