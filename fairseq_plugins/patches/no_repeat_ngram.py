"""``--no-repeat-ngram-size N`` on CPU.

fairseq's ``NGramRepeatBlock`` gets the whole preallocated token buffer, [bsz·beam, max_len + 2],
of which only the first ``step + 1`` columns are written (BOS and the tokens so far, then
padding). The CUDA kernel reads up to ``step``; the Python fallback used on CPU (and wherever
the extension is not built) takes the last N-1 columns of the buffer as the n-gram prefix to
match, i.e. padding, so it bans nothing and every repeated n-gram survives. The fix hands the
fallback the written columns only.
"""
from fairseq.ngram_repeat_block import NGramRepeatBlock

_fairseq_fallback = NGramRepeatBlock._no_repeat_ngram


def _no_repeat_ngram(self, tokens, lprobs, bsz: int, beam_size: int, step: int):
    return _fairseq_fallback(self, tokens[:, : step + 1], lprobs, bsz, beam_size, step)


def install():
    NGramRepeatBlock._no_repeat_ngram = _no_repeat_ngram
