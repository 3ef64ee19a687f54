"""``--match-source-len``: a hypothesis of exactly as many words as its source.

fairseq builds a ``LengthConstrainedBeamSearch`` from the source lengths, which count the
source's EOS: EOS is banned until |S| + 1 words are out (|H| = |S| + 1), and from then on its
log-probability is *set to 0*, so the last ``P-`` score is 0 instead of the model's
log p(EOS) that teacher forcing gives. The fix constrains each step's log-probabilities per
sentence from the source's words (no padding, no EOS) before the search chooses: EOS is
banned before step |S| and is the only choice at step |S|, with its own log-probability.
Any search works under it (beam, and sampling in a generator built from Python: fairseq's
``build_generator``, hence fairseq-generate, refuses ``--sampling`` with it); fairseq's
length-constrained search is bypassed for the plain beam search it wraps.
"""
import contextlib
import math

import torch
from fairseq.search import LengthConstrainedBeamSearch
from fairseq.sequence_generator import SequenceGenerator, SequenceGeneratorWithAlignment

from fairseq_plugins.patches._mechanism import Patch, Target

# generate, not _generate: the Python entry of every generator class (the alignment one has its
# own); _generate stays fairseq's, so torch.jit.script(SequenceGenerator(...)) compiles as without the suite.
GENERATE = Target(SequenceGenerator, "generate", "self, models, sample, **kwargs")
GENERATE_WITH_ALIGNMENT = Target(SequenceGeneratorWithAlignment, "generate", "self, models, sample, **kwargs")


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


def generate(self, models, sample, **kwargs):
    with _matching_source_length(self, sample):
        return GENERATE(self, models, sample, **kwargs)


def generate_with_alignment(self, models, sample, **kwargs):
    with _matching_source_length(self, sample):
        return GENERATE_WITH_ALIGNMENT(self, models, sample, **kwargs)


PATCH = Patch(__name__, {GENERATE: generate, GENERATE_WITH_ALIGNMENT: generate_with_alignment})
