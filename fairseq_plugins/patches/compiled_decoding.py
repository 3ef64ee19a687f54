"""``--compile-decoding`` and ``--quantize-decoding int8``: the two options in fairseq's generation
configuration, and the one warning for a model that is not the suite's given them.

What they do is the suite models' own ``prepare_for_inference_``
(:class:`~fairseq_plugins.models._decoding.SuiteModel`): linear layers prepacked for oneDNN or
quantized to int8, the decoder's hottest step compiled by ``torch.compile``. A model of another
suite has no such method of its own, so only fairseq's, which this patch wraps to say that it
decodes as without the flags. The first run pays the compilation (seconds); torch keeps the code
in its cache directory (``TORCHINDUCTOR_CACHE_DIR``, default ``/tmp/torchinductor_$USER``), where
later runs find it. What it gains: docs/DECODING.md.
"""
import dataclasses
import logging
from typing import Optional

from fairseq.dataclass.configs import GenerationConfig
from fairseq.dataclass.constants import ChoiceEnum
from fairseq.dataclass.initialize import hydra_init
from fairseq.models.fairseq_model import BaseFairseqModel

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
    # imported here: models/ registers the suite's models when imported, after the patches are in
    from fairseq_plugins.models._decoding import SuiteModel, decoding_flags
    flags = decoding_flags(cfg)
    if flags and not isinstance(self, SuiteModel):
        logger.warning("%s: %s is not a fairseq-plugins model; it decodes as without the flag", flags,
                       type(self).__name__)


PATCH = Patch(__name__, {
    **config_options(GenerationConfig, _Options),
    PREPARE: prepare_for_inference_,
}, setup=hydra_init, teardown=hydra_init)
