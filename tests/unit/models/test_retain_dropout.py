"""``--retain-dropout`` keeps dropout on in every family, as in fairseq's built-in transformer; without
the flag, generation is the dropout-free function. Here in process on the models; through
fairseq-generate: tests/integration/test_retain_dropout_generate.py."""
from argparse import Namespace

import pytest
import torch
from conftest import GENERATION_FAMILIES
from fairseq import checkpoint_utils
from fairseq.modules import FairseqDropout


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


# family: (its encoder's class, its decoder's class), the names --retain-dropout-modules selects by
ENCODER_DECODER_NAMES = {
    "vaswani_transformer": ("VaswaniTransformerEncoder", "VaswaniTransformerDecoder"),
    "rnnsearch": ("BiGRUEncoder", "ConditionalGRUDecoder"),
    "rnnencdec": ("GRUEncoder", "ConditionalGRUDecoder"),
    "seq2seq_lstm": ("LSTMEncoder", "LSTMDecoder"),  # nn.LSTM's between-layer dropout follows its module's
}


def random_outputs(model):
    """Which of the encoder and the decoder (on one fixed encoder output) give different outputs on two runs."""
    src = torch.tensor([[4, 5, 6, 7, 8, 9, 2], [1, 1, 10, 11, 12, 13, 2]])  # left-padded, EOS last
    lengths, prev = torch.tensor([7, 5]), torch.tensor([[2, 11, 12, 13, 14], [2, 15, 16, 17, 18]])

    def tensors(value):
        if torch.is_tensor(value):
            return [value]
        items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else []
        return [t for v in items for t in tensors(v)]

    with torch.no_grad():
        torch.manual_seed(0)
        enc = [tensors(model.encoder(src, lengths)) for _ in range(2)]
        encoder_out = model.encoder(src, lengths)
        dec = [model.decoder(prev, encoder_out=encoder_out)[0] for _ in range(2)]
    return ({"encoder"} if not all(torch.equal(a, b) for a, b in zip(*enc)) else set()) | (
        {"decoder"} if not torch.equal(*dec) else set())


@pytest.mark.parametrize("family", list(ENCODER_DECODER_NAMES))
def test_retain_dropout_modules_retains_only_the_named_modules(generation_models, family):
    """fairseq-generate's route (model.prepare_for_inference_ with --retain-dropout and
    --retain-dropout-modules): dropout stays on in the named module alone, the other is deterministic.
    Without the flag neither varies (the control: eval mode is deterministic)."""
    encoder_name, decoder_name = ENCODER_DECODER_NAMES[family]
    selections = {(): set(), (encoder_name,): {"encoder"}, (decoder_name,): {"decoder"},
                  (encoder_name, decoder_name): {"encoder", "decoder"}}
    assert random_outputs(checkpoint_utils.load_model_ensemble([generation_models[family]])[0][0].eval()) == set()
    for names, varying in selections.items():
        model = checkpoint_utils.load_model_ensemble([generation_models[family]])[0][0].eval()
        model.prepare_for_inference_(Namespace(generation=Namespace(
            retain_dropout=True, retain_dropout_modules=list(names) or ["NoSuchModule"], beam=2,
            print_alignment=False)))
        assert random_outputs(model) == varying, f"{family} --retain-dropout-modules {' '.join(names)}"
