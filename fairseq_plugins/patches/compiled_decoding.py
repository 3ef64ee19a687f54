"""``--compile-decoding``: decode a suite model with its linear layers prepacked for oneDNN and its
decoder's hottest step compiled by ``torch.compile``.

fairseq-generate, fairseq-interactive and the hub interface call ``prepare_for_inference_(cfg)``
on every model before decoding; with the flag, that also replaces a suite model's ``nn.Linear``
layers by :class:`~fairseq_plugins.modules.prepacked_linear.PrepackedLinear` (same parameters)
and asks its decoder to compile its step
(:meth:`~fairseq_plugins.modules.beam_cache.BeamCacheDecoder.compile_step`), and logs what it
did, or one warning for a model it does not know. fairseq's generator, its search and the
decoding cache are unchanged. The first run pays the compilation (seconds); torch keeps the code
in its cache directory (``TORCHINDUCTOR_CACHE_DIR``, default ``/tmp/torchinductor_$USER``), where
later runs find it. What it gains: docs/DECODING.md.
"""
import dataclasses
import logging

from fairseq.dataclass.configs import GenerationConfig
from fairseq.dataclass.initialize import hydra_init
from fairseq.models.fairseq_model import BaseFairseqModel

from fairseq_plugins.modules.beam_cache import BeamCacheDecoder
from fairseq_plugins.modules.prepacked_linear import prepack_linear_layers_
from fairseq_plugins.patches._mechanism import Patch, Target, config_options

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class _Options:
    compile_decoding: bool = dataclasses.field(default=False, metadata={
        "help": "fairseq-plugins models: decode with the linear layers' weights prepacked for oneDNN (CPU, "
                "float32) and the decoder's hottest step compiled by torch.compile (RNNsearch: its alignment "
                "model); the first run compiles for seconds, later ones reuse torch's cache (TORCHINDUCTOR_CACHE_DIR)"})


PREPARE = Target(BaseFairseqModel, "prepare_for_inference_", "self, cfg")


def prepare_for_inference_(self, cfg):
    PREPARE(self, cfg)
    generation = getattr(cfg, "generation", None)
    if not getattr(generation, "compile_decoding", False):
        return
    decoder = getattr(self, "decoder", None)
    if not isinstance(decoder, BeamCacheDecoder):
        logger.warning("--compile-decoding: %s is not a fairseq-plugins model; it decodes as without the flag",
                       type(self).__name__)
        return
    done = []
    prepacked = prepack_linear_layers_(self)
    if prepacked:
        done.append(f"prepacks its {prepacked} linear layers for oneDNN")
    compiled = decoder.compile_step()
    if compiled is not None:
        done.append(f"compiles {compiled} at its first decoding step")
    if done:
        logger.info("--compile-decoding: %s %s", type(self).__name__, "; ".join(done))
    else:
        logger.warning("--compile-decoding: %s has nothing to prepack (not an x86 CPU, or torch without oneDNN) "
                       "or compile; it decodes as without the flag", type(self).__name__)


PATCH = Patch(__name__, {
    **config_options(GenerationConfig, _Options),
    PREPARE: prepare_for_inference_,
}, setup=hydra_init, teardown=hydra_init)
