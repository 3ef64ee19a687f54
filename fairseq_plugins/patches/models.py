"""How fairseq's own models load and run.

``encoder_fast_path``: fairseq 0.12.2's built-in transformer encoder stays off its broken
"BetterTransformer" path. Once a checkpoint is loaded, 0.12.2's ``TransformerEncoderLayerBase`` takes a fast path in
eval mode that calls ``torch._transformer_encoder_layer_fwd`` without the ``mask_type``
argument torch >= 2.0 requires, so ``fairseq-generate`` on a built-in ``transformer`` dies
with ``RuntimeError: Mask Type should be defined`` (upstream issues #4858, #4899; fairseq's
main branch removed the fast path). :func:`load_encoder_layer_state` keeps such layers on the
ordinary path, which computes the same function from the same weights. Other fairseq versions
are left alone.
"""
from fairseq.modules.transformer_layer import TransformerEncoderLayerBase

from fairseq_plugins.patches._mechanism import Patch, Target

LOAD = Target(TransformerEncoderLayerBase, "_load_from_state_dict",
              "self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs")
FAST_PATH_FLAG = Target(TransformerEncoderLayerBase, "load_to_BT", instance=True)


def load_encoder_layer_state(layer, *args):
    """0.12.2's state-dict loading, which also fills the fast path's fused weights, without arming that path."""
    LOAD(layer, *args)
    layer.load_to_BT = False  # the flag both the encoder and its layers test before the fast path


def has_fast_path():
    """Only 0.12.2's encoder layer has its own ``_load_from_state_dict`` (it fills the fast path's weights)."""
    return "_load_from_state_dict" in vars(TransformerEncoderLayerBase)


PATCHES = [Patch("encoder_fast_path", {LOAD: load_encoder_layer_state}, applies=has_fast_path, reads=[FAST_PATH_FLAG])]
