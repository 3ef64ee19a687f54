"""``--compile-decoding``: decode with the suite decoder's hottest step compiled by ``torch.compile``.

fairseq-generate, fairseq-interactive and the hub interface call ``prepare_for_inference_(cfg)``
on every model before decoding; with the flag, that also asks a suite decoder to compile its
step (:meth:`~fairseq_plugins.modules.beam_cache.BeamCacheDecoder.compile_step`) and logs what
it compiled, or one warning when a model has nothing to compile. fairseq's generator, its search
and the decoding cache are unchanged. The first run pays the compilation (seconds); torch keeps
the code in its cache directory (``TORCHINDUCTOR_CACHE_DIR``, default
``/tmp/torchinductor_$USER``), where later runs find it. What it gains: docs/DECODING.md.
"""
import dataclasses
import logging

from fairseq.dataclass.configs import GenerationConfig
from fairseq.dataclass.initialize import hydra_init
from fairseq.models.fairseq_model import BaseFairseqModel

from fairseq_plugins.patches._mechanism import Patch, Target, config_options

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class _Options:
    compile_decoding: bool = dataclasses.field(default=False, metadata={
        "help": "compile the decoder's hottest step with torch.compile (RNNsearch: its alignment model); the "
                "first run compiles for seconds, later ones reuse torch's cache (TORCHINDUCTOR_CACHE_DIR)"})


PREPARE = Target(BaseFairseqModel, "prepare_for_inference_", "self, cfg")


def prepare_for_inference_(self, cfg):
    PREPARE(self, cfg)
    generation = getattr(cfg, "generation", None)
    if not getattr(generation, "compile_decoding", False):
        return
    compile_step = getattr(getattr(self, "decoder", None), "compile_step", None)
    compiled = compile_step() if compile_step is not None else None
    if compiled is None:
        logger.warning("--compile-decoding: %s has no step worth compiling; it decodes as without the flag",
                       type(self).__name__)
    else:
        logger.info("--compile-decoding: %s compiles %s at its first decoding step", type(self).__name__, compiled)


PATCH = Patch(__name__, {
    **config_options(GenerationConfig, _Options),
    PREPARE: prepare_for_inference_,
}, setup=hydra_init, teardown=hydra_init)
