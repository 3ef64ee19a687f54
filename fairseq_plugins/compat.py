"""Everything that differs between fairseq and torch versions, in one place.

Checkpoints. torch >= 2.6 loads with ``weights_only=True`` by default, and fairseq's
``load_checkpoint_to_cpu`` (which does not pass the argument) then fails on the
``argparse.Namespace`` every fairseq checkpoint holds. Importing this module

* allows exactly the classes fairseq checkpoints contain (``add_safe_globals``), so
  ``fairseq-generate --path X.pt`` and resuming from ``checkpoint_last.pt`` work with
  the protection against crafted pickles still on;
* makes fairseq's loader use ``weights_only=True`` on older torch too (2.4, 2.5), where
  the default would still unpickle arbitrary code;
* turns a refused, truncated or foreign file into :class:`CheckpointError`, a one-line
  message naming the file, which fairseq's command-line tools print without a traceback.

Batching. fairseq's main branch (hence fairseq-fixed, not 0.12.2) drops the last batch of
``batch_by_size`` whenever its size is not a multiple of ``--required-batch-size-multiple``:
``fairseq-generate`` then silently translates 24 of 30 test sentences and scores BLEU on
them, and validation skips sentences too. :func:`batch_by_size` puts that batch back.

Built-in transformer encoder (fairseq 0.12.2 only). Once a checkpoint is loaded, 0.12.2's
``TransformerEncoderLayerBase`` takes a "BetterTransformer" fast path in eval mode that
calls ``torch._transformer_encoder_layer_fwd`` without the ``mask_type`` argument torch >= 2.0
requires, so ``fairseq-generate`` on a built-in ``transformer`` dies with ``RuntimeError:
Mask Type should be defined`` (upstream issues #4858, #4899; fairseq's main branch removed
the fast path). :func:`load_encoder_layer_state` keeps such layers on the ordinary path,
which computes the same function from the same weights.
"""
import argparse
import contextlib
import re

import numpy as np
import torch
from fairseq import checkpoint_utils
from fairseq.data import data_utils
from fairseq.modules.transformer_layer import TransformerEncoderLayerBase
from omegaconf import DictConfig, OmegaConf

from fairseq_plugins.errors import CheckpointError, install_excepthook

# What fairseq writes: the legacy ``args`` Namespace; metric values that may be numpy
# scalars (``best_loss``, ``val_loss``). Containers, tensors and OrderedDict are allowed
# by torch already; omegaconf configs are stored as plain dicts.
FAIRSEQ_CHECKPOINT_GLOBALS = [
    argparse.Namespace,
    np.dtype,
    (np._core if hasattr(np, "_core") else np.core).multiarray.scalar,
    type(np.dtype(np.float64)),
    type(np.dtype(np.float32)),
    type(np.dtype(np.int64)),
]


def _refusal(name, error):
    """One line saying why ``name`` could not be read as a checkpoint."""
    text = str(error)
    operand = re.search(r"Unsupported operand (\d+)", text)
    if operand:
        return (f"{name}: not a readable checkpoint, truncated or not a torch file (pickle instruction "
                f"{operand.group(1)} is refused by the weights-only loader)")
    match = re.search(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) ([\w.]+)", text)
    if match:
        return (f"{name}: refused to load: it needs {match.group(1)}, which fairseq checkpoints never hold "
                "(a pickle that could run code)")
    # Skip torch's generic preamble ("Weights only load failed...", "Check the documentation").
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(("Weights only", "Check the doc"))]
    first_line = (lines or [type(error).__name__])[0]
    return f"{name}: not a readable checkpoint, truncated or not a torch file ({type(error).__name__}: {first_line})"


def _weights_only_load(f, *args, _torch_load=torch.load, **kwargs):
    kwargs["weights_only"] = True
    try:
        return _torch_load(f, *args, **kwargs)
    except Exception as e:  # whatever the bytes make torch raise, the file is the cause
        raise CheckpointError(_refusal(getattr(f, "name", f), e)) from None


@contextlib.contextmanager
def _weights_only_torch_load():
    """fairseq calls ``torch.load(f, map_location=...)``: make that call weights-only."""
    torch.load = _weights_only_load
    try:
        yield
    finally:
        torch.load = _weights_only_load.__kwdefaults__["_torch_load"]


def load_checkpoint_to_cpu(path, *args, _fairseq_loader=checkpoint_utils.load_checkpoint_to_cpu, **kwargs):
    """fairseq's loader, weights-only on every torch version, with one-line errors."""
    with _weights_only_torch_load():
        return _fairseq_loader(path, *args, **kwargs)


def load_state(path):
    """Read a checkpoint with the suite's safe loader; it must hold model weights."""
    state = load_checkpoint_to_cpu(path)
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{path}: not a fairseq checkpoint (no 'model' entry)")
    return state


def save_state(state, path):
    """Write a checkpoint dict the way fairseq does, atomically (temporary name, then rename).

    fairseq's loader turns the stored ``cfg`` into an omegaconf DictConfig; it is stored as
    plain containers again so the file loads weights-only.
    """
    if isinstance(state.get("cfg"), DictConfig):
        state = dict(state, cfg=OmegaConf.to_container(state["cfg"], resolve=True, enum_to_str=True))
    checkpoint_utils.torch_persistent_save(state, path)


def batch_by_size(indices, *args, _fairseq_batch_by_size=data_utils.batch_by_size, **kwargs):
    """fairseq's batching, keeping every index (0.12.2's behaviour)."""
    batches = _fairseq_batch_by_size(indices, *args, **kwargs)
    covered = sum(len(b) for b in batches)
    if covered < len(indices):
        # The batches are consecutive runs of ``indices``: what is missing is the final run,
        # a batch fairseq had built (within --max-tokens/--batch-size) and then discarded.
        batches = list(batches) + [np.asarray(indices[covered:], dtype=np.int64)]
    return batches


def load_encoder_layer_state(layer, *args, _fairseq_load=TransformerEncoderLayerBase._load_from_state_dict):
    """0.12.2's state-dict loading, which also fills the fast path's fused weights, without arming that path."""
    _fairseq_load(layer, *args)
    layer.load_to_BT = False  # the flag both the encoder and its layers test before the fast path


def is_encoder_fast_path_copy(key):
    """Whether ``key`` is one of the state-dict entries 0.12.2's encoder layers add for that fast path.

    ``encoder.layers.N.{in_proj,out_proj,fc1,fc2}_{weight,bias}``: copies of ``self_attn``'s
    q/k/v/out projections and of ``fc1``/``fc2`` (zeros in a checkpoint saved by training), so
    a converter can drop them. Checkpoints of other fairseq versions have none.
    """
    return re.search(r"(^|\.)encoder\.layers\.\d+\.(in_proj|out_proj|fc1|fc2)_(weight|bias)$", key) is not None


def install():
    if hasattr(torch.serialization, "add_safe_globals"):
        torch.serialization.add_safe_globals(FAIRSEQ_CHECKPOINT_GLOBALS)
    if checkpoint_utils.load_checkpoint_to_cpu is not load_checkpoint_to_cpu:
        checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu
    data_utils.batch_by_size = batch_by_size
    if "_load_from_state_dict" in vars(TransformerEncoderLayerBase):  # only 0.12.2 overrides it (fast path)
        TransformerEncoderLayerBase._load_from_state_dict = load_encoder_layer_state
    install_excepthook()


install()
