"""fairseq loads its own checkpoints under torch >= 2.6, weights-only on every torch version.

torch >= 2.6 loads with ``weights_only=True`` by default, and fairseq's
``load_checkpoint_to_cpu`` (which does not pass the argument) then fails on the
``argparse.Namespace`` every fairseq checkpoint holds. The patch

* allows exactly the classes fairseq checkpoints contain (``add_safe_globals``, undone by uninstalling), so
  ``fairseq-generate --path X.pt`` and resuming from ``checkpoint_last.pt`` work with
  the protection against crafted pickles still on;
* makes fairseq's loaders (``load_checkpoint_to_cpu``, ``load_ema_from_checkpoint``) use ``weights_only=True`` on older torch too (2.4, 2.5), where
  the default would still unpickle arbitrary code;
* turns a refused, truncated or foreign file into :class:`CheckpointError`, a one-line
  message naming the file, which fairseq's command-line tools print without a traceback; so
  also a torch file that is not a fairseq checkpoint (a bare ``state_dict()``, a checkpoint
  stripped of the entries fairseq's loader reads), where fairseq ends in a KeyError's traceback.
"""
import argparse
import re

import numpy as np
from fairseq import checkpoint_utils

from fairseq_plugins.errors import CheckpointError
from fairseq_plugins.patches._mechanism import Patch, Target
from fairseq_plugins.patches._weights_only import TORCH_LOAD, allowing, weights_only_torch_load

LOAD = Target(checkpoint_utils, "load_checkpoint_to_cpu", "path, arg_overrides, load_on_all_ranks")
LOAD_EMA = Target(checkpoint_utils, "load_ema_from_checkpoint", "fpath")

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


def _refused(f, error):
    return CheckpointError(_refusal(getattr(f, "name", f), error))


def _fairseq_checkpoint(f, state):
    """What every reader of a fairseq checkpoint takes for granted: a dict with the model's weights."""
    name = getattr(f, "name", f)
    if not isinstance(state, dict):
        raise CheckpointError(f"{name}: not a fairseq checkpoint (a {type(state).__name__}, not a dict of entries)")
    if "model" not in state:
        raise CheckpointError(f"{name}: not a fairseq checkpoint (no 'model' entry)")


def load_checkpoint_to_cpu(path, *args, **kwargs):
    """fairseq's loader, weights-only on every torch version, with one-line errors."""
    with weights_only_torch_load(_refused, check=_fairseq_checkpoint):
        try:
            return LOAD(path, *args, **kwargs)
        except KeyError as missing:  # fairseq's upgrade of older layouts indexes entries this file lacks
            raise CheckpointError(f"{path}: not a complete fairseq checkpoint (fairseq's loader found no "
                                  f"{missing} entry)") from None


def load_ema_from_checkpoint(path):
    """fairseq's EMA loader (``torch.load`` of its own), weights-only too."""
    with weights_only_torch_load(_refused):
        return LOAD_EMA(path)


_setup, _teardown = allowing(FAIRSEQ_CHECKPOINT_GLOBALS)
PATCH = Patch(__name__, {LOAD: load_checkpoint_to_cpu, LOAD_EMA: load_ema_from_checkpoint},
              scoped=[TORCH_LOAD], setup=_setup, teardown=_teardown)
