"""Decoding with fairseq's generator, its command-line tools and its hub interface.

Behaviours (``FAIRSEQ_PLUGINS_DISABLE_PATCHES`` takes each name, or ``generation`` for all):

* ``match_source_len``: ``--match-source-len``: a hypothesis of exactly as many words as its source.

  fairseq builds a ``LengthConstrainedBeamSearch`` from the source lengths, which count the
  source's EOS: EOS is banned until |S| + 1 words are out (|H| = |S| + 1), and from then on its
  log-probability is *set to 0*, so the last ``P-`` score is 0 instead of the model's
  log p(EOS) that teacher forcing gives. The fix constrains each step's log-probabilities per
  sentence from the source's words (no padding, no EOS) before the search chooses: EOS is
  banned before step |S| and is the only choice at step |S|, with its own log-probability.
  Any search works under it (beam, and sampling in a generator built from Python: fairseq's
  ``build_generator``, hence fairseq-generate, refuses ``--sampling`` with it); fairseq's
  length-constrained search is bypassed for the plain beam search it wraps.

* ``max_len_warning``: fairseq-generate warns when most hypotheses stopped at the length limit, not at EOS.

  A model that has not learned to end sentences (too few updates, an initialisation that
  trains slowly: issue 18) fills every hypothesis up to ``max_len_a * src_len + max_len_b``
  tokens, and fairseq-generate reports only a low BLEU. This counts, per translated sentence,
  whether its best hypothesis was cut at the limit (EOS forced at step ``max_len``, fairseq's
  ``SequenceGenerator._generate``), on the generator that translated it
  (``generator.length_limit_counts``), and ``fairseq-generate`` ends with one warning line when
  that was the case for more than half of the sentences its generators translated.

* ``no_repeat_ngram``: ``--no-repeat-ngram-size N`` on CPU.

  fairseq's ``NGramRepeatBlock`` gets the whole preallocated token buffer, [bsz·beam, max_len + 2],
  of which only the first ``step + 1`` columns are written (BOS and the tokens so far, then
  padding). The CUDA kernel reads up to ``step``; the Python fallback used on CPU (and wherever
  the extension is not built) takes the last N-1 columns of the buffer as the n-gram prefix to
  match, i.e. padding, so it bans nothing and every repeated n-gram survives. The fix is the
  fallback reading the written columns only.

  The replacement is compiled by ``torch.jit.script(SequenceGenerator(...))`` (it is reached from
  ``forward``), so it is fairseq's fallback written out with the fix, typed for TorchScript,
  rather than a call of the original through Python.

* ``replace_unk``: ``--replace-unk [DICT]``: UNK replacement from attention (Luong et al., 2015; Jean et al., 2015).

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

* ``alignment_attention``: alignments from a generator that was asked for them after the model was prepared.

  ``fairseq-generate --print-alignment`` tells the decoders to return attention through
  ``prepare_for_inference_`` (``need_attn``). The hub interface prepares the model once, in
  ``from_pretrained``, and builds a new generator per call, so
  ``hub.generate(..., print_alignment="hard")`` reaches decoders that still skip their
  attention weights (the suite's Transformer, which computes them only on demand, and fairseq's
  ``lstm``), and fairseq's alignment extraction fails with ``IndexError``. The fix turns
  ``need_attn`` on in every module that has it for the duration of an alignment generator's
  ``generate``, and restores it afterwards. A model without attention (``has_attention = False``:
  RNNencdec, the seq2seq LSTM) is refused in one line instead of fairseq's ``IndexError``.

* ``hub_score``: hub ``score()`` for translation models.

  fairseq's ``GeneratorHubInterface.score(sentences)`` scores each sentence as a language model
  would: it batches the sentences as sources and runs the teacher-forced scorer, whose forward
  needs a target, so every encoder-decoder model fails with ``TypeError: forward() missing 1
  required positional argument: 'prev_output_tokens'``. With the fix,
  ``hub.score(source, targets=translation)`` (or lists of both) returns what
  ``fairseq-generate --score-reference`` computes for each pair: ``positional_scores``
  (natural log, one per target word and the final EOS) and ``score`` (their mean). An
  encoder-decoder model without ``targets`` is refused in one line; language models are unchanged.

* ``compiled_decoding``: ``--compile-decoding`` and ``--quantize-decoding int8``: the two options in fairseq's generation
  configuration, and the one warning for a model that is not the suite's given them.

  What they do is the suite models' own ``prepare_for_inference_``
  (:class:`~fairseq_plugins.models._decoding.SuiteModel`): linear layers prepacked for oneDNN or
  quantized to int8, the decoder's hottest step compiled by ``torch.compile``. A model of another
  suite has no such method of its own, so only fairseq's, which this patch wraps to say that it
  decodes as without the flags. The first run pays the compilation (seconds); torch keeps the code
  in its cache directory (``TORCHINDUCTOR_CACHE_DIR``, default ``/tmp/torchinductor_$USER``), where
  later runs find it. What it gains: docs/DECODING.md.

Three of them change the generators' ``generate``, each replaced once (:data:`GENERATE`,
:data:`GENERATE_WITH_ALIGNMENT`), their steps in the order listed there.
"""
import contextlib
import contextvars
import dataclasses
import logging
import math
from typing import List, Optional

import fairseq.utils as fairseq_utils
import fairseq_cli.generate as generate_cli
import torch
from fairseq.data import LanguagePairDataset
from fairseq.dataclass.configs import GenerationConfig
from fairseq.dataclass.constants import ChoiceEnum
from fairseq.dataclass.initialize import hydra_init
from fairseq.hub_utils import GeneratorHubInterface
from fairseq.models import FairseqEncoderDecoderModel
from fairseq.models.fairseq_model import BaseFairseqModel
from fairseq.ngram_repeat_block import NGramRepeatBlock
from fairseq.search import LengthConstrainedBeamSearch
from fairseq.sequence_generator import SequenceGenerator, SequenceGeneratorWithAlignment
from fairseq.tasks import FairseqTask
from omegaconf import open_dict

from fairseq_plugins.errors import ConfigError
from fairseq_plugins.patches._mechanism import Patch, Target, Wrap, config_options

logger = logging.getLogger(__name__)
length_logger = logging.getLogger("fairseq_plugins.max_len_warning")

# generate, not _generate: the Python entry of every generator class (the alignment one has its
# own); _generate stays fairseq's, so torch.jit.script(SequenceGenerator(...)) compiles as without the suite.
# Outermost first: the count sees the hypotheses of the length-constrained search.
GENERATE = Wrap(Target(SequenceGenerator, "generate", "self, models, sample, **kwargs"),
                order=["max_len_warning", "match_source_len"])
GENERATE_WITH_ALIGNMENT = Wrap(Target(SequenceGeneratorWithAlignment, "generate", "self, models, sample, **kwargs"),
                               order=["max_len_warning", "match_source_len", "alignment_attention"])
# The generator's own settings, which the length limit and the length constraint read as fairseq does.
GENERATOR_READS = [Target(SequenceGenerator, name, instance=True)
                   for name in ("search", "match_source_len", "max_len_a", "max_len_b", "max_len")]

# -- match_source_len --------------------------------------------------------------------------------------------------

CONSTRAINED_BEAM = Target(LengthConstrainedBeamSearch, "beam", instance=True)  # the plain search it wraps


def _source_words(generator, sample):
    """(sorted keys, words): words per source sentence (no padding, no EOS), keyed as the search's
    ``original_batch_idxs`` (the sample ids, or the rows when there are none)."""
    src_tokens = sample["net_input"]["src_tokens"]
    words = (src_tokens.ne(generator.eos) & src_tokens.ne(generator.pad)).long().sum(dim=1)
    keys = sample["id"] if isinstance(sample.get("id"), torch.Tensor) else torch.arange(len(words))
    keys, order = keys.to(words.device).sort()
    return keys, words[order]


def _constrained_step(search_step, eos, keys, words_by_key):
    def step(step, lprobs, scores, prev_output_tokens=None, original_batch_idxs=None, *args, **kwargs):
        rows = torch.searchsorted(keys, original_batch_idxs.to(keys.device))
        words = words_by_key[rows].to(lprobs.device)  # [bsz]
        lprobs[(step < words), :, eos] = -math.inf  # too early to end
        at_end = step == words
        eos_lprobs = lprobs[at_end, :, eos].clone()
        lprobs[at_end] = -math.inf  # the length is reached: end here
        lprobs[at_end, :, eos] = eos_lprobs
        return search_step(step, lprobs, scores, prev_output_tokens, original_batch_idxs, *args, **kwargs)
    return step


def _matching_source_length(generator, sample):
    """For one call: the generator's search constrained to the source lengths of ``sample``: a scoped
    replacement of this search object's ``step`` (one generator decodes in one thread at a time:
    fairseq's search objects keep state between steps)."""
    if not generator.match_source_len:
        return contextlib.nullcontext()
    search = generator.search
    step = Target(search, "step")
    choose = search.beam.step if isinstance(search, LengthConstrainedBeamSearch) else step
    return step.replaced(_constrained_step(choose, generator.eos, *_source_words(generator, sample)))


def match_source_length(call, self, models, sample, **kwargs):
    with _matching_source_length(self, sample):
        return call(self, models, sample, **kwargs)


# -- max_len_warning ---------------------------------------------------------------------------------------------------

MAIN = Target(generate_cli, "_main", "cfg, output_file")

# The generators that translated within the fairseq-generate call in progress (in this thread or task).
_run = contextvars.ContextVar("fairseq_plugins.max_len_warning.run", default=None)


class LengthLimitCounts:
    """A generator's count of translated sentences, and of those whose best hypothesis was cut at the limit."""

    def __init__(self):
        self.sentences = 0
        self.at_limit = 0


def counts(generator):
    """The generator's own :class:`LengthLimitCounts` (made at its first batch)."""
    return vars(generator).setdefault("length_limit_counts", LengthLimitCounts())


def length_limit(generator: SequenceGenerator, sample) -> int:
    """The ``max_len`` fairseq's beam search uses for this batch (the same formula)."""
    src_tokens = sample["net_input"]["src_tokens"]
    if generator.match_source_len:
        return int(sample["net_input"]["src_lengths"].max().item())
    return min(int(generator.max_len_a * src_tokens.size(1) + generator.max_len_b), generator.max_len - 1)


def _count(generator, sample, finalized):
    limit = length_limit(generator, sample)
    own = counts(generator)
    for hypos in finalized:
        own.sentences += 1
        # a hypothesis cut at the limit has max_len tokens and the forced EOS
        own.at_limit += bool(hypos) and hypos[0]["tokens"].numel() > limit
    run = _run.get()
    if run is not None and generator not in run:
        run.append(generator)
    return finalized


def count_length_limit(call, self, models, sample, **kwargs):
    return _count(self, sample, call(self, models, sample, **kwargs))


def warning(at_limit: int, sentences: int, max_len_a, max_len_b) -> str:
    return (f"{at_limit} of {sentences} hypotheses ({100 * at_limit / sentences:.0f}%) stopped at the maximum "
            f"length (--max-len-a {max_len_a:g} x source length + --max-len-b {max_len_b}), not at end of "
            "sentence: the model has not learned to stop (train longer) or the limit is too small")


def main(cfg, output_file):
    """fairseq-generate's ``_main``, ending with the warning when most of its hypotheses were cut."""
    generators = []
    token = _run.set(generators)
    try:
        result = MAIN(cfg, output_file)
    finally:
        _run.reset(token)
    at_limit = sum(counts(g).at_limit for g in generators)
    sentences = sum(counts(g).sentences for g in generators)
    if at_limit * 2 > sentences:
        length_logger.warning(warning(at_limit, sentences, cfg.generation.max_len_a, cfg.generation.max_len_b))
    return result


# -- no_repeat_ngram ---------------------------------------------------------------------------------------------------

FALLBACK = Target(NGramRepeatBlock, "_no_repeat_ngram", "self, tokens, lprobs, bsz, beam_size, step")


def _no_repeat_ngram(self, tokens, lprobs, bsz: int, beam_size: int, step: int):
    """Ban, per hypothesis, each token that would complete an n-gram already among its written tokens."""
    n = self.no_repeat_ngram_size
    banned_tokens = [torch.jit.annotate(List[int], []) for _ in range(bsz * beam_size)]
    if step + 2 - n >= 0:
        cpu_tokens: List[List[int]] = tokens[:, : step + 1].cpu().tolist()  # the written columns
        for bbsz_idx in range(bsz * beam_size):
            row = cpu_tokens[bbsz_idx]
            prefix = row[len(row) - (n - 1):]
            for i in range(step + 2 - n):
                if prefix == row[i: i + n - 1]:
                    banned_tokens[bbsz_idx].append(row[i + n - 1])
    for bbsz_idx in range(bsz * beam_size):
        lprobs[bbsz_idx][torch.tensor(banned_tokens[bbsz_idx], dtype=torch.int64)] = torch.tensor(-math.inf).to(lprobs)
    return lprobs


def bans_from_written_tokens():
    """Whether fairseq's own fallback bans a repeated bigram when the buffer has padding after the tokens."""
    block = NGramRepeatBlock(2, use_extension=False)
    tokens = torch.tensor([[2, 5, 6, 5, 1, 1]])  # BOS, "5 6 5" (step 3), padding: 6 would repeat "5 6"
    lprobs = FALLBACK(block, tokens, torch.zeros(1, 8), 1, 1, 3)
    return bool(lprobs[0, 6] == -math.inf)


# -- alignment_attention -----------------------------------------------------------------------------------------------

def attention_on(models):
    """Inside: ``need_attn`` is on in every module of ``models`` that has it; afterwards, what it was."""
    scope = contextlib.ExitStack()
    for model in models:
        for module in model.modules():
            if hasattr(module, "need_attn"):
                scope.enter_context(Target(module, "need_attn").set_to(True))
    return scope


def attention_for_alignment(call, self, models, sample, **kwargs):
    for model in self.model.models:
        if not getattr(model, "has_attention", True):
            raise ConfigError(f"--print-alignment: {type(model).__name__} has no attention to align with")
    with attention_on(self.model.models):
        return call(self, models, sample, **kwargs)


# -- replace_unk -------------------------------------------------------------------------------------------------------

LOAD_ALIGN_DICT = Target(fairseq_utils, "load_align_dict", "replace_unk")
REPLACE_UNK = Target(fairseq_utils, "replace_unk", "hypo_str, src_str, alignment, align_dict, unk")
POST_PROCESS = Target(fairseq_utils, "post_process_prediction",
                      "hypo_tokens, src_str, alignment, align_dict, tgt_dict, remove_bpe, extra_symbols_to_ignore")
BUILD_GENERATOR = Target(FairseqTask, "build_generator",
                         "self, models, args, seq_gen_cls, extra_gen_cls_kwargs, prefix_allowed_tokens_fn")
INFERENCE_STEP = Target(FairseqTask, "inference_step", "self, generator, models, sample, prefix_tokens, constraints")
GENERATE_MAIN = Target(generate_cli, "main", "cfg")

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


# -- hub_score ---------------------------------------------------------------------------------------------------------

SCORE = Target(GeneratorHubInterface, "score", "self, sentences, replace_newline_with_eos, **kwargs")


def _encode_target(hub, sentence):
    return hub.tgt_dict.encode_line(hub.apply_bpe(hub.tokenize(sentence)), add_if_not_exist=False).long()


def score(self, sentences, replace_newline_with_eos: bool = False, targets=None, **kwargs):
    if targets is None:
        if isinstance(self.models[0], FairseqEncoderDecoderModel):
            raise ConfigError("score() of a translation model needs targets=: the translation(s) to score")
        return SCORE(self, sentences, replace_newline_with_eos, **kwargs)
    if isinstance(sentences, str) != isinstance(targets, str):
        raise ConfigError("score(): give one source and one target string, or two lists of the same length")
    if isinstance(sentences, str):
        return score(self, [sentences], targets=[targets], **kwargs)[0]
    if len(sentences) != len(targets):
        raise ConfigError(f"score(): {len(sentences)} sources but {len(targets)} targets")
    src = [self.encode(s) for s in sentences]
    tgt = [_encode_target(self, t) for t in targets]
    task_cfg = self.task.cfg
    dataset = LanguagePairDataset(src, [len(t) for t in src], self.src_dict, tgt, [len(t) for t in tgt],
                                  self.tgt_dict, left_pad_source=task_cfg.left_pad_source,
                                  left_pad_target=task_cfg.left_pad_target)
    batch = dataset.collater([dataset[i] for i in range(len(src))])
    batch = {k: (v.to(self.device) if hasattr(v, "to") else v) for k, v in batch.items()}
    batch["net_input"] = {k: v.to(self.device) for k, v in batch["net_input"].items()}
    gen_args = self.cfg.generation.copy()
    with open_dict(gen_args):
        gen_args.score_reference = True
        for key, value in kwargs.items():
            setattr(gen_args, key, value)
    scorer = self.task.build_generator(self.models, gen_args)
    hypos = self.task.inference_step(scorer, self.models, batch)
    by_id = dict(zip(batch["id"].tolist(), hypos))  # the collater sorts by source length
    return [by_id[i][0] for i in range(len(src))]


# -- compiled_decoding -------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Options:
    compile_decoding: bool = dataclasses.field(default=False, metadata={
        "help": "fairseq-plugins models: decode with the linear layers' weights prepacked for oneDNN (CPU, "
                "float32) and the decoder's hottest step compiled by torch.compile (RNNsearch: its alignment "
                "model); the first run compiles for seconds, later ones reuse torch's cache (TORCHINDUCTOR_CACHE_DIR)"})
    quantize_decoding: Optional[ChoiceEnum(["int8"])] = dataclasses.field(default=None, metadata={
        "help": "fairseq-plugins models on a CPU: decode with int8 linear layers (int8 weights per output "
                "channel, each call's input rounded to 8 bits; PyTorch's dynamic quantization), faster where the "
                "CPU has int8 dot products (AVX512-VNNI, AVX-VNNI, AMX); hypotheses can differ from float32's"})


PREPARE = Target(BaseFairseqModel, "prepare_for_inference_", "self, cfg")


def prepare_for_inference_(self, cfg):
    PREPARE(self, cfg)
    # imported here: models/ registers the suite's models when imported, after the patches are in
    from fairseq_plugins.models._decoding import SuiteModel, decoding_flags
    flags = decoding_flags(cfg)
    if flags and not isinstance(self, SuiteModel):
        logger.warning("%s: %s is not a fairseq-plugins model; it decodes as without the flag", flags,
                       type(self).__name__)


PATCHES = [
    Patch("match_source_len", reads=[CONSTRAINED_BEAM, *GENERATOR_READS],
          steps={GENERATE: match_source_length, GENERATE_WITH_ALIGNMENT: match_source_length}),
    Patch("max_len_warning", {MAIN: main}, reads=GENERATOR_READS,
          steps={GENERATE: count_length_limit, GENERATE_WITH_ALIGNMENT: count_length_limit}),
    Patch("no_repeat_ngram", {FALLBACK: _no_repeat_ngram}, fixed_upstream=bans_from_written_tokens),
    Patch("replace_unk", {LOAD_ALIGN_DICT: load_align_dict, REPLACE_UNK: replace_unk,
                          POST_PROCESS: post_process_prediction, BUILD_GENERATOR: build_generator,
                          INFERENCE_STEP: inference_step, GENERATE_MAIN: generate_main}),
    Patch("alignment_attention", steps={GENERATE_WITH_ALIGNMENT: attention_for_alignment}),
    Patch("hub_score", {SCORE: score}),
    Patch("compiled_decoding", {**config_options(GenerationConfig, _Options), PREPARE: prepare_for_inference_},
          setup=hydra_init, teardown=hydra_init),
]
