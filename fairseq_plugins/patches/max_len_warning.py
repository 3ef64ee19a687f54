"""fairseq-generate warns when most hypotheses stopped at the length limit, not at EOS.

A model that has not learned to end sentences (too few updates, an initialisation that
trains slowly: issue 18) fills every hypothesis up to ``max_len_a * src_len + max_len_b``
tokens, and fairseq-generate reports only a low BLEU. This counts, per translated sentence,
whether its best hypothesis was cut at the limit (EOS forced at step ``max_len``, fairseq's
``SequenceGenerator._generate``), on the generator that translated it
(``generator.length_limit_counts``), and ``fairseq-generate`` ends with one warning line when
that was the case for more than half of the sentences its generators translated.
"""
import contextvars
import logging

import fairseq_cli.generate as generate_cli
from fairseq.sequence_generator import SequenceGenerator, SequenceGeneratorWithAlignment

from fairseq_plugins.patches._mechanism import Patch, Target

logger = logging.getLogger("fairseq_plugins.max_len_warning")

# generate, not _generate: the Python entry of every generator class (the alignment one has its
# own); _generate stays fairseq's, so torch.jit.script(SequenceGenerator(...)) compiles as without the suite.
GENERATE = Target(SequenceGenerator, "generate", "self, models, sample, **kwargs")
GENERATE_WITH_ALIGNMENT = Target(SequenceGeneratorWithAlignment, "generate", "self, models, sample, **kwargs")
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


def generate(self, models, sample, **kwargs):
    return _count(self, sample, GENERATE(self, models, sample, **kwargs))


def generate_with_alignment(self, models, sample, **kwargs):
    return _count(self, sample, GENERATE_WITH_ALIGNMENT(self, models, sample, **kwargs))


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
        logger.warning(warning(at_limit, sentences, cfg.generation.max_len_a, cfg.generation.max_len_b))
    return result


PATCH = Patch(__name__, {GENERATE: generate, GENERATE_WITH_ALIGNMENT: generate_with_alignment, MAIN: main})
