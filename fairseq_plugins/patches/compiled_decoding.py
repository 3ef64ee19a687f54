"""``--compile-decoding``: decode a suite model with its linear layers prepacked for oneDNN and its
decoder's hottest step compiled by ``torch.compile``; ``--quantize-decoding int8``: with int8
linear layers.

fairseq-generate, fairseq-interactive and the hub interface call ``prepare_for_inference_(cfg)``
on every model before decoding; with the flag, that also replaces a suite model's ``nn.Linear``
layers by :class:`~fairseq_plugins.modules.decoding_linear.PrepackedLinear` (same parameters)
and asks its decoder to compile its step
(:meth:`~fairseq_plugins.modules.beam_cache.BeamCacheDecoder.compile_step`), and logs what it
did, or one warning for a model it does not know. ``--quantize-decoding int8`` first replaces
the linear layers by PyTorch's dynamically quantized ones
(:func:`~fairseq_plugins.modules.decoding_linear.quantize_linear_layers_`), with one warning on a
CPU without int8 dot products. fairseq's generator, its search and the
decoding cache are unchanged. The first run pays the compilation (seconds); torch keeps the code
in its cache directory (``TORCHINDUCTOR_CACHE_DIR``, default ``/tmp/torchinductor_$USER``), where
later runs find it. What it gains: docs/DECODING.md.
"""
import dataclasses
import logging
from typing import Optional

import torch
from fairseq.dataclass.configs import GenerationConfig
from fairseq.dataclass.constants import ChoiceEnum
from fairseq.dataclass.initialize import hydra_init
from fairseq.models.fairseq_model import BaseFairseqModel

from fairseq_plugins.errors import ConfigError
from fairseq_plugins.hardware import INT8_DOT_PRODUCTS, cpu_flags, int8_note
from fairseq_plugins.modules.beam_cache import BeamCacheDecoder
from fairseq_plugins.modules.decoding_linear import int8_engine, prepack_linear_layers_, quantize_linear_layers_
from fairseq_plugins.patches._mechanism import Patch, Target, config_options

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class _Options:
    compile_decoding: bool = dataclasses.field(default=False, metadata={
        "help": "fairseq-plugins models: decode with the linear layers' weights prepacked for oneDNN (CPU, "
                "float32) and the decoder's hottest step compiled by torch.compile (RNNsearch: its alignment "
                "model); the first run compiles for seconds, later ones reuse torch's cache (TORCHINDUCTOR_CACHE_DIR)"})
    quantize_decoding: Optional[ChoiceEnum(["int8"])] = dataclasses.field(default=None, metadata={
        "help": "fairseq-plugins models on a CPU: decode with int8 linear layers (int8 weights per output "
                "channel, each call's input rounded to 8 bits; PyTorch's dynamic quantization), faster where the "
                "CPU has int8 dot products (AVX512-VNNI, AVX-VNNI, AMX); hypotheses can differ from float32's"})


PREPARE = Target(BaseFairseqModel, "prepare_for_inference_", "self, cfg")


def prepare_for_inference_(self, cfg):
    PREPARE(self, cfg)
    generation = getattr(cfg, "generation", None)
    compile_decoding = getattr(generation, "compile_decoding", False)
    quantize = getattr(generation, "quantize_decoding", None)
    flags = " ".join(([f"--quantize-decoding {quantize}"] if quantize else []) +
                     (["--compile-decoding"] if compile_decoding else []))
    if not flags:
        return
    decoder = getattr(self, "decoder", None)
    if not isinstance(decoder, BeamCacheDecoder):
        logger.warning("%s: %s is not a fairseq-plugins model; it decodes as without the flag", flags,
                       type(self).__name__)
        return
    done = []
    if quantize == "int8":
        if any(p.device.type != "cpu" or p.dtype != torch.float32 for p in self.parameters()):
            raise ConfigError("--quantize-decoding int8: int8 decoding runs on a CPU from float32 weights; add "
                              "--cpu and leave out --fp16/--bf16")
        isa = cpu_flags()
        if not any(flag in isa for flag in INT8_DOT_PRODUCTS):
            logger.warning("--quantize-decoding int8: %s", int8_note(isa))
        engine = int8_engine(isa)
        done.append(f"quantizes its {quantize_linear_layers_(self, engine)} linear layers to int8 ({engine} kernels)")
    if compile_decoding:
        prepacked = prepack_linear_layers_(self)  # those left in float32
        if prepacked:
            done.append(f"prepacks its {prepacked} linear layers for oneDNN")
        compiled = decoder.compile_step()
        if compiled is not None:
            done.append(f"compiles {compiled} at its first decoding step")
    if done:
        logger.info("%s: %s %s", flags, type(self).__name__, "; ".join(done))
    else:
        logger.warning("%s: %s has nothing to prepack (not an x86 CPU, or torch without oneDNN) or compile; it "
                       "decodes as without the flag", flags, type(self).__name__)


PATCH = Patch(__name__, {
    **config_options(GenerationConfig, _Options),
    PREPARE: prepare_for_inference_,
}, setup=hydra_init, teardown=hydra_init)
