"""Translation with the length penalty of the Transformer paper (Wu et al., 2016).

Vaswani et al. (2017, §6.1) decode with beam 4 and "length penalty α = 0.6", the penalty of
Google's NMT system (Wu et al., 2016, eq. 14, without its coverage term):

    lp(Y) = (5 + |Y|)^α / (5 + 1)^α          score(Y, X) = log P(Y|X) / lp(Y)

fairseq's ``--lenpen α`` divides by ``|Y|^α`` instead, a different ranking of short and
long hypotheses. ``--task translation_wu --wu-lenpen α`` decodes with lp(Y) (|Y| counts the
tokens including the final EOS, as tensor2tensor does); everything else is fairseq's
``translation`` task, so models trained with ``--task translation`` decode with it as they
are. ``--unnormalized`` still gives raw log-probabilities; ``--lenpen`` must stay at 1.
"""
from dataclasses import dataclass, field

from fairseq.sequence_generator import SequenceGenerator, SequenceGeneratorWithAlignment
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from fairseq_plugins.errors import ConfigError


def wu_length_penalty(length: int, alpha: float) -> float:
    return ((5 + length) / (5 + 1)) ** alpha  # lp(Y) = (5 + |Y|)^α / (5 + 1)^α


class _WuLengthPenalty:
    """Makes a fairseq SequenceGenerator score finished hypotheses by log P / lp(Y)."""

    def __init__(self, *args, wu_alpha: float, **kwargs):
        normalize = kwargs.get("normalize_scores", True)
        kwargs["normalize_scores"] = False  # fairseq's |Y|^lenpen division is replaced below
        super().__init__(*args, **kwargs)
        self.wu_alpha = wu_alpha if normalize else None

    def finalize_hypos(self, step, bbsz_idx, eos_scores, tokens, scores, finalized, *args):
        done_before = [len(hypos) for hypos in finalized]
        num_finished = super().finalize_hypos(step, bbsz_idx, eos_scores, tokens, scores,
                                              finalized, *args)
        if self.wu_alpha is not None:
            lp = wu_length_penalty(step + 1, self.wu_alpha)  # |Y| = step + 1 tokens, EOS included
            for hypos, before in zip(finalized, done_before):
                for hypo in hypos[before:]:  # hypotheses finished at this step
                    hypo["score"] = hypo["score"] / lp  # log P(Y|X) / lp(Y)
        return num_finished


class WuSequenceGenerator(_WuLengthPenalty, SequenceGenerator):
    pass


class WuSequenceGeneratorWithAlignment(_WuLengthPenalty, SequenceGeneratorWithAlignment):
    pass


@dataclass
class TranslationWuConfig(TranslationConfig):
    wu_lenpen: float = field(
        default=0.6,
        metadata={"help": "α of the length penalty lp(Y) = ((5 + |Y|) / 6)^α of Wu et al. (2016) "
                          "used by Vaswani et al. (2017) (α = 0.6); replaces fairseq's --lenpen"},
    )


@register_task("translation_wu", dataclass=TranslationWuConfig)
class TranslationWuTask(TranslationTask):
    """fairseq's ``translation`` task, decoding with Wu et al.'s length penalty."""

    cfg: TranslationWuConfig

    def build_generator(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None,
                        prefix_allowed_tokens_fn=None):
        if getattr(args, "lenpen", 1) != 1:
            raise ConfigError(f"--lenpen {args.lenpen} does not apply with --task translation_wu; "
                             "set the length penalty with --wu-lenpen")
        if seq_gen_cls is None:  # a caller's own generator class is left as it is
            extra_gen_cls_kwargs = dict(extra_gen_cls_kwargs or {}, wu_alpha=self.cfg.wu_lenpen)
            if getattr(args, "print_alignment", False):
                seq_gen_cls = WuSequenceGeneratorWithAlignment
                extra_gen_cls_kwargs["print_alignment"] = args.print_alignment
            else:
                seq_gen_cls = WuSequenceGenerator
        return super().build_generator(models, args, seq_gen_cls, extra_gen_cls_kwargs,
                                       prefix_allowed_tokens_fn)
