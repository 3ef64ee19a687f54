"""Alignments from a generator that was asked for them after the model was prepared.

``fairseq-generate --print-alignment`` tells the decoders to return attention through
``prepare_for_inference_`` (``need_attn``). The hub interface prepares the model once, in
``from_pretrained``, and builds a new generator per call, so
``hub.generate(..., print_alignment="hard")`` reaches decoders that still skip their
attention weights (the suite's Transformer, which computes them only on demand, and fairseq's
``lstm``), and fairseq's alignment extraction fails with ``IndexError``. The fix turns
``need_attn`` on in every module that has it for the duration of an alignment generator's
``generate``, and restores it afterwards. A model without attention (``has_attention = False``:
RNNencdec, the seq2seq LSTM) is refused in one line instead of fairseq's ``IndexError``.
"""
import contextlib

from fairseq.sequence_generator import SequenceGeneratorWithAlignment

from fairseq_plugins.errors import ConfigError
from fairseq_plugins.patches._mechanism import Patch, Target

GENERATE = Target(SequenceGeneratorWithAlignment, "generate", "self, models, sample, **kwargs")


def attention_on(models):
    """Inside: ``need_attn`` is on in every module of ``models`` that has it; afterwards, what it was."""
    scope = contextlib.ExitStack()
    for model in models:
        for module in model.modules():
            if hasattr(module, "need_attn"):
                scope.enter_context(Target(module, "need_attn").set_to(True))
    return scope


def _generate(self, models, sample, **kwargs):
    for model in self.model.models:
        if not getattr(model, "has_attention", True):
            raise ConfigError(f"--print-alignment: {type(model).__name__} has no attention to align with")
    with attention_on(self.model.models):
        return GENERATE(self, models, sample, **kwargs)


PATCH = Patch(__name__, {GENERATE: _generate})
