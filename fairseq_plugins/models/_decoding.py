"""``--compile-decoding`` and ``--quantize-decoding`` on the suite's models (:class:`SuiteModel`).

fairseq-generate, fairseq-interactive and the hub interface call ``prepare_for_inference_(cfg)``
on every model before decoding. A suite model's, with ``--compile-decoding``, also replaces its
``nn.Linear`` layers by :class:`~fairseq_plugins.modules.decoding_linear.PrepackedLinear` (same
parameters) and compiles what dominates its decoder's step (:meth:`SuiteModel.compile_step`);
``--quantize-decoding int8`` first replaces the linear layers by PyTorch's dynamically quantized
ones (:func:`~fairseq_plugins.modules.decoding_linear.quantize_linear_layers_`), with one warning
on a CPU without int8 dot products. It logs what it did in one line. fairseq's generator, its
search and the decoding cache are unchanged. The options themselves are fairseq's generation
options as ``patches/generation.py`` (its ``compiled_decoding``) extends them; that patch also warns for a model of
another suite given them. What it gains: docs/DECODING.md.
"""
import logging
from typing import Optional

import torch
from fairseq.models import FairseqEncoderDecoderModel

from fairseq_plugins.errors import ConfigError
from fairseq_plugins.hardware import INT8_DOT_PRODUCTS, cpu_flags, int8_note
from fairseq_plugins.modules.decoding_linear import int8_engine, prepack_linear_layers_, quantize_linear_layers_

logger = logging.getLogger("fairseq_plugins.models")


def decoding_flags(cfg) -> str:
    """The decoding flags ``cfg`` sets, as a user types them ("" for none, and for a configuration
    made without the options)."""
    generation = getattr(cfg, "generation", None)
    quantize = getattr(generation, "quantize_decoding", None)
    return " ".join(([f"--quantize-decoding {quantize}"] if quantize else []) +
                    (["--compile-decoding"] if getattr(generation, "compile_decoding", False) else []))


class SuiteModel(FairseqEncoderDecoderModel):
    """fairseq's encoder–decoder model with the suite's decoding options in
    ``prepare_for_inference_``; every model of the suite is one."""

    def compile_step(self) -> Optional[str]:
        """Compiles what dominates the decoder's step (``--compile-decoding``) and says what; None:
        nothing worth compiling (the model stays as it is)."""
        return None

    def prepare_for_inference_(self, cfg):
        super().prepare_for_inference_(cfg)
        flags = decoding_flags(cfg)
        if not flags:
            return
        quantize = cfg.generation.quantize_decoding
        done = []
        if quantize == "int8":
            if any(p.device.type != "cpu" or p.dtype != torch.float32 for p in self.parameters()):
                raise ConfigError("--quantize-decoding int8: int8 decoding runs on a CPU from float32 weights; add "
                                  "--cpu and leave out --fp16/--bf16")
            isa = cpu_flags()
            if not any(flag in isa for flag in INT8_DOT_PRODUCTS):
                logger.warning("--quantize-decoding int8: %s", int8_note(isa))
            engine = int8_engine(isa)
            done.append(f"quantizes its {quantize_linear_layers_(self, engine)} linear layers to int8 "
                        f"({engine} kernels)")
        if cfg.generation.compile_decoding:
            prepacked = prepack_linear_layers_(self)  # those left in float32
            if prepacked:
                done.append(f"prepacks its {prepacked} linear layers for oneDNN")
            compiled = self.compile_step()
            if compiled is not None:
                done.append(f"compiles {compiled} at its first decoding step")
        if done:
            logger.info("%s: %s %s", flags, type(self).__name__, "; ".join(done))
        else:
            logger.warning("%s: %s has nothing to prepack (not an x86 CPU, or torch without oneDNN) or compile; it "
                           "decodes as without the flag", flags, type(self).__name__)
