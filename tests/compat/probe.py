"""Facts about this environment's fairseq and torch, measured, as JSON on stdout (scripts/test_compat.sh)."""
import argparse
import importlib.metadata as md
import io
import json
import os
import sys
import tempfile
import warnings

import numpy as np
import torch
from fairseq import checkpoint_utils
from fairseq.criterions import CRITERION_REGISTRY
from fairseq.data import data_utils
from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY
from fairseq.optim import OPTIMIZER_REGISTRY
from fairseq.optim.lr_scheduler import LR_SCHEDULER_REGISTRY
from fairseq.tasks import TASK_REGISTRY

warnings.filterwarnings("ignore")


class RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def kept_of_30():
    """Indices kept by batch_by_size for 30 sentences, batches of 16, multiple of 8 (all 30 expected)."""
    batches = data_utils.batch_by_size(np.arange(30), lambda i: 10, max_sentences=16, required_batch_size_multiple=8)
    return int(sum(len(b) for b in batches))


def hostile_checkpoint(tmp):
    """What fairseq's own loader does with a checkpoint whose pickle runs code."""
    marker = os.path.join(tmp, "code-ran")
    path = os.path.join(tmp, "evil.pt")
    torch.save({"model": {}, "payload": RunsCode(marker)}, path)
    try:
        checkpoint_utils.load_checkpoint_to_cpu(path)
        outcome = "loaded"
    except Exception as e:
        outcome = f"refused ({type(e).__name__})"
    ran = os.path.exists(marker)
    if ran:
        os.remove(marker)
    return outcome + (", pickle code RAN" if ran else ", code not run")


def default_weights_only():
    buf = io.BytesIO()
    torch.save({"args": argparse.Namespace(a=1)}, buf)
    buf.seek(0)
    try:
        torch.load(buf)
        return False
    except Exception:
        return True


def distribution():
    for name in ("fairseq", "fairseq-fixed"):
        try:
            return f"{name} {md.version(name)}"
        except md.PackageNotFoundError:
            pass
    return "?"


with tempfile.TemporaryDirectory() as tmp:
    facts = {
        "python": sys.version.split()[0],
        "fairseq": distribution(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "torch.load default weights_only": default_weights_only(),
        "torch has add_safe_globals": hasattr(torch.serialization, "add_safe_globals"),
        "fairseq alone: batch_by_size keeps (of 30)": kept_of_30(),
        "fairseq alone: hostile checkpoint": hostile_checkpoint(tmp),
    }
    registries = {"criterion": CRITERION_REGISTRY, "model": MODEL_REGISTRY, "arch": ARCH_MODEL_REGISTRY,
                  "lr_scheduler": LR_SCHEDULER_REGISTRY, "optimizer": OPTIMIZER_REGISTRY, "task": TASK_REGISTRY}
    builtin = {kind: sorted(reg) for kind, reg in registries.items()}
    import fairseq_plugins  # noqa: F401  (the suite's patches and registrations)
    facts["with the suite: batch_by_size keeps (of 30)"] = kept_of_30()
    facts["with the suite: hostile checkpoint"] = hostile_checkpoint(tmp)
    facts["suite names registered"] = sum(len(set(reg) - set(builtin[k])) for k, reg in registries.items())
print(json.dumps({"facts": facts, "builtin": builtin}))
