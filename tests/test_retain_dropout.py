"""``fairseq-generate --retain-dropout`` keeps dropout on in every family, as in fairseq's built-in
transformer; without the flag, generation is the dropout-free function."""
import pytest
import torch
from conftest import GENERATION_FAMILIES
from fairseq import checkpoint_utils
from fairseq.modules import FairseqDropout
from helpers import generate


@pytest.mark.slow
@pytest.mark.parametrize("family", list(GENERATION_FAMILIES))
def test_retain_dropout_changes_hypotheses(generation_models, plain_generations, data_bin, family):
    plain = plain_generations[family]  # the best hypothesis is the first of --nbest 2
    retained = generate(data_bin, generation_models[family], "--retain-dropout", "--seed", "7")
    changed = sum(plain[i]["H"] != retained[i]["H"] for i in plain)  # score or words
    assert changed >= len(plain) // 2, f"{family}: {changed}/{len(plain)} hypotheses changed"


@pytest.mark.slow
def test_retain_dropout_modules_selects_by_class_name(generation_models, plain_generations, data_bin):
    path = generation_models["vaswani_transformer"]
    plain = plain_generations["vaswani_transformer"]  # --nbest 2
    decoder_only = generate(data_bin, path, "--retain-dropout", "--retain-dropout-modules",
                            "VaswaniTransformerDecoder", "--seed", "7")
    other = generate(data_bin, path, "--retain-dropout", "--retain-dropout-modules", "LSTMDecoder", "--seed", "7",
                     "--nbest", "2")
    assert sum(plain[i]["H"] != decoder_only[i]["H"] for i in plain) >= len(plain) // 2
    assert other == plain


@pytest.mark.parametrize("family", list(GENERATION_FAMILIES))
def test_eval_without_the_flag_is_dropout_free(generation_models, family):
    """Oracle: the same weights with every dropout probability set to 0."""
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([generation_models[family]])
    model = models[0].eval()
    src = torch.tensor([[4, 5, 6, 7, 2], [1, 8, 9, 10, 2]])  # left-padded, EOS last
    prev = torch.tensor([[2, 11, 12, 13], [2, 14, 15, 16]])
    with torch.no_grad():
        out = model(src, torch.tensor([5, 4]), prev)[0]
        for m in model.modules():
            if isinstance(m, FairseqDropout):
                m.p = 0.0
            if isinstance(m, torch.nn.LSTM):
                m.dropout = 0.0
        model.train()  # dropout modules now off by probability, not by mode
        reference = model(src, torch.tensor([5, 4]), prev)[0]
    torch.testing.assert_close(out, reference, rtol=0, atol=1e-5)  # train-mode kernels differ in rounding
