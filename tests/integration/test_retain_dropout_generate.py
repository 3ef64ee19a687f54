"""``fairseq-generate --retain-dropout`` (subprocesses) changes the hypotheses of every family, and
``--retain-dropout-modules`` selects by class name. The models in process: tests/unit/models/test_retain_dropout.py."""
import pytest
from conftest import GENERATION_FAMILIES
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
