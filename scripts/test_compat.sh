#!/usr/bin/env bash
# Compatibility check (not part of .ci/run): the suite on official fairseq 0.12.2 under
# Python 3.10 with a pinned torch, in a virtualenv outside the repository.
#
#   bash scripts/test_compat.sh            # create/reuse the env, run the tests, print the differences
#   bash scripts/test_compat.sh -x         # extra arguments go to pytest
#
# Needs about 7 GB of disk and several minutes of downloads on the first run (PyPI's torch
# is the CUDA build; the CPU wheel index is tried first). Settings, by environment variable:
#   COMPAT_VENV    where the env lives           (default /work/compat-venv; never inside the repo)
#   COMPAT_PYTHON  a Python 3.10 interpreter     (default: python3.10 on PATH, else pyenv's 3.10.x)
#   COMPAT_TORCH   torch version, pinned together with the torchaudio of the same release (default 2.5.1)
#   COMPAT_FAIRSEQ fairseq requirement           (default fairseq==0.12.2)
#   MAIN_VENV      the suite's usual env, the other side of the comparison (default .venv)
# Exit status: pytest's (0 when every selected test passed on fairseq 0.12.2).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
COMPAT_VENV=${COMPAT_VENV:-/work/compat-venv}
COMPAT_TORCH=${COMPAT_TORCH:-2.5.1}
COMPAT_TORCHAUDIO=${COMPAT_TORCHAUDIO:-$COMPAT_TORCH}  # torchaudio X.Y.Z is built for torch X.Y.Z
COMPAT_FAIRSEQ=${COMPAT_FAIRSEQ:-fairseq==0.12.2}
MAIN_VENV=${MAIN_VENV:-.venv}
CPU_INDEX=https://download.pytorch.org/whl/cpu

case "$(realpath -m "$COMPAT_VENV")/" in
    "$REPO"/*) echo "error: COMPAT_VENV=$COMPAT_VENV lies inside the repository; put it outside (default /work/compat-venv)" >&2
               exit 2 ;;
esac

find_python() {  # the first candidate that really is Python 3.10 (a pyenv shim may not be)
    local root candidate
    root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
    for candidate in ${COMPAT_PYTHON:-} $(command -v python3.10) $(ls -d "$root"/versions/3.10.*/bin/python3.10 2>/dev/null | sort -rV); do
        if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 10)' 2>/dev/null; then
            echo "$candidate"; return
        fi
        [ -n "${COMPAT_PYTHON:-}" ] && return  # an explicit choice that is not 3.10: no fallback
    done
}

# ---- 1. the environment (reused while this script, setup.py and the pins are unchanged) ----
stamp="$COMPAT_VENV/.compat-$(cat setup.py "$0" | sha1sum | cut -c1-10)-torch$COMPAT_TORCH"
if [ ! -f "$stamp" ]; then
    PY=$(find_python)
    if [ -z "$PY" ]; then
        echo "error: COMPAT_PYTHON: no Python 3.10 interpreter found${COMPAT_PYTHON:+ ($COMPAT_PYTHON is not 3.10)}; set COMPAT_PYTHON=/path/to/python3.10" >&2
        exit 2
    fi
    echo "== creating $COMPAT_VENV with $("$PY" -V) (first run: several minutes, about 7 GB)"
    start=$SECONDS
    [ -x "$COMPAT_VENV/bin/python" ] || "$PY" -m venv "$COMPAT_VENV"
    pip=("$COMPAT_VENV/bin/pip" install --quiet --disable-pip-version-check)
    constraints="$COMPAT_VENV/compat-constraints.txt"
    # fairseq 0.12.2 asks for torchaudio; unpinned, pip replaces torch with the newest CUDA build.
    printf 'torch==%s\ntorchaudio==%s\n' "$COMPAT_TORCH" "$COMPAT_TORCHAUDIO" > "$constraints"
    if ! "$COMPAT_VENV/bin/pip" show torch 2>/dev/null | grep -qx "Version: $COMPAT_TORCH\(+.*\)\?"; then
        "${pip[@]}" --index-url "$CPU_INDEX" --timeout 15 --retries 0 -c "$constraints" torch torchaudio 2>/dev/null ||
            { echo "   $CPU_INDEX unreachable or without torch $COMPAT_TORCH: PyPI's build (CUDA, about 5 GB)"
              "${pip[@]}" -c "$constraints" torch torchaudio; }
    fi
    "${pip[@]}" -c "$constraints" "$COMPAT_FAIRSEQ"
    "${pip[@]}" -c "$constraints" -e ".[test]"
    rm -f "$COMPAT_VENV"/.compat-*
    touch "$stamp"
    echo "   done in $((SECONDS - start)) s; $(du -sh "$COMPAT_VENV" | cut -f1); torch $("$COMPAT_VENV/bin/python" -c "import torch; print(torch.__version__)" 2>/dev/null)"
fi
PYTHON="$COMPAT_VENV/bin/python"
"$PYTHON" -c "import fairseq_plugins" || { echo "error: $COMPAT_VENV: fairseq_plugins does not import" >&2; exit 1; }

# ---- 2. the tests: the end-to-end CLIs of every family, and the version-independent oracles ----
# (formulas on small tensors, fairseq built-ins on the same weights, incremental == full,
# padding and batch invariance). Not selected: analysis tools, corpus generator, quickstart,
# WMT pipelines and reliability drills, which exercise the suite's own code rather than fairseq.
tests=()
for f in tests/test_compat.py tests/test_registry.py tests/test_criterion.py tests/test_lr_scheduler.py \
         tests/test_end_to_end.py tests/test_rnn_models.py tests/test_rnn_cli.py tests/test_transformer*.py \
         tests/test_numerical_faults.py; do
    [ -f "$f" ] && tests+=("$f")
done
echo "== pytest on $COMPAT_FAIRSEQ: ${tests[*]}"
log=$(mktemp)
set +e
"$PYTHON" -m pytest -q -p no:cacheprovider -rfEs --durations=5 "${tests[@]}" "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e

# ---- 3. what differs between the two fairseq versions ----
probe=$(mktemp --suffix .py)
trap 'rm -f "$log" "$probe" "$probe".*.json' EXIT
cat > "$probe" <<'EOF'
"""Facts about this env's fairseq and torch, measured, as JSON on stdout."""
import argparse, importlib.metadata as md, io, json, os, sys, tempfile, warnings
warnings.filterwarnings("ignore")
import numpy as np, torch
from fairseq import checkpoint_utils
from fairseq.criterions import CRITERION_REGISTRY
from fairseq.data import data_utils
from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY
from fairseq.optim import OPTIMIZER_REGISTRY
from fairseq.optim.lr_scheduler import LR_SCHEDULER_REGISTRY
from fairseq.tasks import TASK_REGISTRY


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
EOF
"$PYTHON" "$probe" > "$probe.compat.json" 2>/dev/null
if [ -x "$MAIN_VENV/bin/python" ]; then
    "$MAIN_VENV/bin/python" "$probe" > "$probe.main.json" 2>/dev/null
else
    echo "(no $MAIN_VENV: the comparison column for the usual env is left out)"
    echo '{"facts": {}, "builtin": {}}' > "$probe.main.json"
fi
echo
echo "== differences: $COMPAT_VENV vs $MAIN_VENV (measured by both pythons)"
"$PYTHON" - "$probe.compat.json" "$probe.main.json" "$log" <<'EOF'
import json, re, sys
compat, main = (json.load(open(p)) for p in sys.argv[1:3])
rows = [(k, str(v), str(main["facts"].get(k, "-"))) for k, v in compat["facts"].items()]
w = [max(len(r[i]) for r in rows + [("", "compat env", "usual env")]) for i in range(3)]
print(f"{'':{w[0]}}  {'compat env':{w[1]}}  usual env")
for k, a, b in rows:
    print(f"{k:{w[0]}}  {a:{w[1]}}  {b}{'' if a == b else '   <- differs'}")
for kind in compat["builtin"]:
    a, b = set(compat["builtin"][kind]), set(main["builtin"].get(kind, []))
    if b and a != b:
        print(f"fairseq built-in {kind}s only in the usual env ({len(b - a)}): {', '.join(sorted(b - a)) or '-'}")
        print(f"fairseq built-in {kind}s only in the compat env ({len(a - b)}): {', '.join(sorted(a - b)) or '-'}")
summary = [ln for ln in open(sys.argv[3]).read().splitlines() if re.match(r"=*\s*\d+ (passed|failed|error).* in [\d.]+s", ln)]
print(f"pytest on {compat['facts']['fairseq']}, Python {compat['facts']['python']}, "
      f"torch {compat['facts']['torch']}: {summary[-1].strip('= ') if summary else 'no summary line'}")
EOF
exit "$status"
