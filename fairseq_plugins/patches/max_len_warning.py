"""fairseq-generate warns when most hypotheses stopped at the length limit, not at EOS.

A model that has not learned to end sentences (too few updates, an initialisation that
trains slowly: issue 18) fills every hypothesis up to ``max_len_a * src_len + max_len_b``
tokens, and fairseq-generate reports only a low BLEU. This counts, per translated sentence,
whether its best hypothesis was cut at the limit (EOS forced at step ``max_len``, fairseq's
``SequenceGenerator._generate``), and ``fairseq-generate`` ends with one warning line when
that was the case for more than half of them.
"""
import logging

import fairseq_cli.generate as generate_cli
from fairseq.sequence_generator import SequenceGenerator

logger = logging.getLogger("fairseq_plugins.max_len_warning")
counts = {"sentences": 0, "at_limit": 0}


def length_limit(generator: SequenceGenerator, sample) -> int:
    """The ``max_len`` fairseq's beam search uses for this batch (the same formula)."""
    src_tokens = sample["net_input"]["src_tokens"]
    if generator.match_source_len:
        return int(sample["net_input"]["src_lengths"].max().item())
    return min(int(generator.max_len_a * src_tokens.size(1) + generator.max_len_b), generator.max_len - 1)


def counting_generate(original):
    # _generate: the beam search every generator class runs (with alignment, translation_wu too)
    def _generate(self, sample, *args, **kwargs):
        finalized = original(self, sample, *args, **kwargs)
        limit = length_limit(self, sample)
        for hypos in finalized:
            counts["sentences"] += 1
            # a hypothesis cut at the limit has max_len tokens and the forced EOS
            counts["at_limit"] += bool(hypos) and hypos[0]["tokens"].numel() > limit
        return finalized

    _generate.wrapped = original
    return _generate


def warning(at_limit: int, sentences: int, max_len_a, max_len_b) -> str:
    return (f"{at_limit} of {sentences} hypotheses ({100 * at_limit / sentences:.0f}%) stopped at the maximum "
            f"length (--max-len-a {max_len_a:g} x source length + --max-len-b {max_len_b}), not at end of "
            "sentence: the model has not learned to stop (train longer) or the limit is too small")


def reporting_main(original):
    def _main(cfg, output_file):
        counts.update(sentences=0, at_limit=0)
        result = original(cfg, output_file)
        if counts["at_limit"] * 2 > counts["sentences"]:
            logger.warning(warning(counts["at_limit"], counts["sentences"], cfg.generation.max_len_a,
                                   cfg.generation.max_len_b))
        return result

    _main.wrapped = original
    return _main


def install() -> None:
    """Idempotent: wraps SequenceGenerator._generate and fairseq-generate's _main once."""
    if not hasattr(SequenceGenerator._generate, "wrapped"):
        SequenceGenerator._generate = counting_generate(SequenceGenerator._generate)
    if not hasattr(generate_cli._main, "wrapped"):
        generate_cli._main = reporting_main(generate_cli._main)
