"""Hub ``score()`` for translation models.

fairseq's ``GeneratorHubInterface.score(sentences)`` scores each sentence as a language model
would: it batches the sentences as sources and runs the teacher-forced scorer, whose forward
needs a target, so every encoder-decoder model fails with ``TypeError: forward() missing 1
required positional argument: 'prev_output_tokens'``. With the fix,
``hub.score(source, targets=translation)`` (or lists of both) returns what
``fairseq-generate --score-reference`` computes for each pair: ``positional_scores``
(natural log, one per target word and the final EOS) and ``score`` (their mean). An
encoder-decoder model without ``targets`` is refused in one line; language models are unchanged.
"""
from fairseq.data import LanguagePairDataset
from fairseq.hub_utils import GeneratorHubInterface
from fairseq.models import FairseqEncoderDecoderModel
from omegaconf import open_dict

from fairseq_plugins.errors import ConfigError
from fairseq_plugins.patches._mechanism import Patch, Target

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


PATCH = Patch(__name__, {SCORE: score})
