"""The hub interface (``from_pretrained``): ``generate(print_alignment=...)`` without preparing for it
(the families with attention: RNNsearch and the Transformer), and ``score(source, targets=...)`` with
every family."""
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


@pytest.mark.parametrize("family", ["rnnsearch", "vaswani_transformer"])
def test_generate_soft_alignments_are_the_attention_of_a_full_forward(generation_models, data_bin, corpus_dir,
                                                                      family):
    """hub.generate(print_alignment="soft") from the beam search's incremental steps: each row is the
    attention over the source tokens that one teacher-forced forward of the hypothesis gives."""
    model = hub(BaseFairseqModel, generation_models[family], data_bin)
    sources = open(f"{corpus_dir}/test.src").read().splitlines()[:4]
    encoded = [model.encode(s) for s in sources]
    generated = model.generate(encoded, beam=2, print_alignment="soft")
    for module in model.models[0].modules():  # as fairseq-generate --print-alignment asks (prepare_for_inference_)
        if hasattr(module, "need_attn"):
            module.need_attn = True
    for src, hypos in zip(encoded, generated):
        tokens = hypos[0]["tokens"]  # words + EOS
        prev = torch.cat([tokens.new_tensor([model.tgt_dict.eos()]), tokens[:-1]])[None]
        with torch.no_grad():
            _, extra = model.models[0](src[None], torch.tensor([len(src)]), prev)
        attention = extra["attn"][0][0]  # (target tokens, source tokens)
        soft = torch.tensor([[float(p) for p in row] for row in hypos[0]["alignment"]])
        assert soft.shape == attention.shape == (len(tokens), len(src))
        torch.testing.assert_close(soft, attention, atol=2e-6, rtol=0)  # printed with 6 decimals


@pytest.mark.parametrize("family", ["rnnencdec", "seq2seq_lstm"])
def test_generate_alignments_of_a_family_without_attention_are_refused_in_one_line(generation_models, data_bin,
                                                                                   family):
    model = hub(BaseFairseqModel, generation_models[family], data_bin)
    with pytest.raises(ConfigError, match="print_alignment|--print-alignment"):
        model.generate([model.encode("a b c")], beam=2, print_alignment="hard")
