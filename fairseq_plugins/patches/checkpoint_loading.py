"""fairseq loads its own checkpoints under torch >= 2.6, weights-only on every torch version.

torch >= 2.6 loads with ``weights_only=True`` by default, and fairseq's
``load_checkpoint_to_cpu`` (which does not pass the argument) then fails on the
``argparse.Namespace`` every fairseq checkpoint holds. :func:`install`

* allows exactly the classes fairseq checkpoints contain (``add_safe_globals``), so
  ``fairseq-generate --path X.pt`` and resuming from ``checkpoint_last.pt`` work with
  the protection against crafted pickles still on;
* makes fairseq's loaders (``load_checkpoint_to_cpu``, ``load_ema_from_checkpoint``) use ``weights_only=True`` on older torch too (2.4, 2.5), where
  the default would still unpickle arbitrary code;
* turns a refused, truncated or foreign file into :class:`CheckpointError`, a one-line
  message naming the file, which fairseq's command-line tools print without a traceback.
"""
import argparse
import contextlib
import re

import numpy as np
import torch
from fairseq import checkpoint_utils

from fairseq_plugins.errors import CheckpointError

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


def load_ema_from_checkpoint(path, _fairseq_loader=checkpoint_utils.load_ema_from_checkpoint):
    """fairseq's EMA loader (``torch.load`` of its own), weights-only too."""
    with _weights_only_torch_load():
        return _fairseq_loader(path)


def install():
    if hasattr(torch.serialization, "add_safe_globals"):
        torch.serialization.add_safe_globals(FAIRSEQ_CHECKPOINT_GLOBALS)
    if checkpoint_utils.load_checkpoint_to_cpu is not load_checkpoint_to_cpu:
        checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu
    checkpoint_utils.load_ema_from_checkpoint = load_ema_from_checkpoint
