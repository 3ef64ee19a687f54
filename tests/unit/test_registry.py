"""Importing the suite registers every name that users and scripts rely on. Their flags' bad values on
fairseq-train's command line: tests/integration/test_registry_cli.py."""
import pytest
from fairseq.criterions import CRITERION_REGISTRY
from fairseq.models import ARCH_MODEL_NAME_REGISTRY, ARCH_MODEL_REGISTRY
from fairseq.optim.lr_scheduler import LR_SCHEDULER_REGISTRY
from fairseq.tasks import TASK_REGISTRY

import fairseq_plugins  # noqa: F401

ARCHS = {
    "vaswani_transformer": ["vaswani_transformer_base", "vaswani_transformer_big", "vaswani_transformer_tiny"],
    "rnnsearch": ["rnnsearch", "rnnsearch_tiny"],
    "rnnencdec": ["rnnencdec", "rnnencdec_tiny"],
    "seq2seq_lstm": ["seq2seq_lstm", "seq2seq_lstm_tiny"],
}


def test_archs_registered_under_their_models():
    for model, archs in ARCHS.items():
        for arch in archs:
            assert ARCH_MODEL_NAME_REGISTRY[arch] == model
            assert ARCH_MODEL_REGISTRY[arch].__module__.startswith("fairseq_plugins.models.")


@pytest.mark.parametrize("registry, name", [(CRITERION_REGISTRY, "label_smoothed_xent"),
                                            (LR_SCHEDULER_REGISTRY, "inverse_sqrt_warmup"),
                                            (LR_SCHEDULER_REGISTRY, "sutskever_halving"),
                                            (TASK_REGISTRY, "translation_wu")])
def test_components_registered(registry, name):
    assert registry[name].__module__.startswith("fairseq_plugins.")


def test_builtins_untouched():
    """The suite adds names; fairseq's own stay fairseq's."""
    for arch in ("transformer", "lstm", "transformer_wmt_en_de_big"):
        assert ARCH_MODEL_REGISTRY[arch].__module__.startswith("fairseq.")
    assert CRITERION_REGISTRY["label_smoothed_cross_entropy"].__module__.startswith("fairseq.")
    assert LR_SCHEDULER_REGISTRY["inverse_sqrt"].__module__.startswith("fairseq.")
