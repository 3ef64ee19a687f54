"""The hub interface (``from_pretrained``) with every family: ``generate(print_alignment=...)``
without preparing for it, and ``score(source, targets=...)``."""
import os

import pytest
import torch
from conftest import GENERATION_FAMILIES
from fairseq.models import BaseFairseqModel
from fairseq.models.transformer import TransformerModel
from helpers import run, teacher_forced_log2probs

from fairseq_plugins.errors import ConfigError
from fairseq_plugins.models.transformer import VaswaniTransformerModel

pytestmark = pytest.mark.slow


def hub(cls, path, data):
    return cls.from_pretrained(os.path.dirname(path), checkpoint_file=os.path.basename(path),
                               data_name_or_path=data).eval()


def test_generate_alignments_match_the_builtin(generation_models, data_bin, corpus_dir, tmp_path):
    """The converted built-in model gives fairseq's own hypotheses and hard alignments."""
    builtin = generation_models["builtin_transformer"]
    converted = tmp_path / "converted.pt"
    run(["fairseq-plugins-convert-transformer", builtin, converted])
    sources = open(f"{corpus_dir}/test.src").read().splitlines()[:6]
    results = []
    for cls, path in ((TransformerModel, builtin), (VaswaniTransformerModel, str(converted))):
        model = hub(cls, path, data_bin)
        hypos = model.generate([model.encode(s) for s in sources], beam=2, print_alignment="hard")
        results.append([(h[0]["tokens"].tolist(), h[0]["alignment"]) for h in hypos])
    assert results[0] == results[1]
    assert all(len(alignment) == len(tokens) - 1 for tokens, alignment in results[0])  # one per word


@pytest.mark.parametrize("family", list(GENERATION_FAMILIES))
def test_score_is_teacher_forcing(generation_models, data_bin, corpus_dir, family):
    model = hub(BaseFairseqModel, generation_models[family], data_bin)
    sources = open(f"{corpus_dir}/test.src").read().splitlines()[:4]
    targets = open(f"{corpus_dir}/test.tgt").read().splitlines()[:4]
    scored = model.score(sources, targets=targets)
    for source, target, result in zip(sources, targets, scored):
        # the source/target dictionaries map rare words to <unk>, as the scorer sees them
        reference = teacher_forced_log2probs(generation_models[family], source, target)
        log2 = (result["positional_scores"] / torch.log(torch.tensor(2.0))).tolist()
        assert log2 == pytest.approx(reference, abs=1e-4)
    assert model.score(sources[0], targets=targets[0])["tokens"].tolist() == scored[0]["tokens"].tolist()
    with pytest.raises(ConfigError, match="needs targets="):
        model.score(sources[0])
