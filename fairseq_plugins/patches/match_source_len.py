"""``--match-source-len``: a hypothesis of exactly as many words as its source.

fairseq builds a ``LengthConstrainedBeamSearch`` from the source lengths, which count the
source's EOS: EOS is banned until |S| + 1 words are out (|H| = |S| + 1), and from then on its
log-probability is *set to 0*, so the last ``P-`` score is 0 instead of the model's
log p(EOS) that teacher forcing gives. The fix constrains each step's log-probabilities per
sentence from the source's words (no padding, no EOS) before the search chooses: EOS is
banned before step |S| and is the only choice at step |S|, with its own log-probability.
Any search works under it (beam, sampling); fairseq's length-constrained one is bypassed for
the plain beam search it wraps.
"""
import math

import torch
from fairseq.search import LengthConstrainedBeamSearch
from fairseq.sequence_generator import SequenceGenerator

_fairseq_generate = SequenceGenerator._generate


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


def _generate(self, sample, *args, **kwargs):
    if not self.match_source_len:
        return _fairseq_generate(self, sample, *args, **kwargs)
    search = self.search
    own_step = vars(search).get("step")  # an instance attribute someone else set, if any
    choose = search.beam.step if isinstance(search, LengthConstrainedBeamSearch) else search.step
    search.step = _constrained_step(choose, self.eos, *_source_words(self, sample))
    try:
        return _fairseq_generate(self, sample, *args, **kwargs)
    finally:
        if own_step is None:
            del search.step  # back to the class's method
        else:
            search.step = own_step


def install():
    SequenceGenerator._generate = _generate
