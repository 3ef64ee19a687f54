"""``--no-repeat-ngram-size N`` on CPU.

fairseq's ``NGramRepeatBlock`` gets the whole preallocated token buffer, [bsz·beam, max_len + 2],
of which only the first ``step + 1`` columns are written (BOS and the tokens so far, then
padding). The CUDA kernel reads up to ``step``; the Python fallback used on CPU (and wherever
the extension is not built) takes the last N-1 columns of the buffer as the n-gram prefix to
match, i.e. padding, so it bans nothing and every repeated n-gram survives. The fix is the
fallback reading the written columns only.

The replacement is compiled by ``torch.jit.script(SequenceGenerator(...))`` (it is reached from
``forward``), so it is fairseq's fallback written out with the fix, typed for TorchScript,
rather than a call of the original through Python.
"""
import math
from typing import List

import torch
from fairseq.ngram_repeat_block import NGramRepeatBlock

from fairseq_plugins.patches._mechanism import Patch, Target

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


PATCH = Patch(__name__, {FALLBACK: _no_repeat_ngram}, fixed_upstream=bans_from_written_tokens)
