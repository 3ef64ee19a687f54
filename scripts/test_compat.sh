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
#   COMPAT_TORCH   torch version, pinned together with the torchaudio of the same release (default 2.7.0)
#   COMPAT_FAIRSEQ fairseq requirement           (default fairseq==0.12.2)
#   MAIN_VENV      the suite's usual env, the other side of the comparison (default .venv)
# Exit status: pytest's (0 when every selected test passed on fairseq 0.12.2).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
COMPAT_VENV=${COMPAT_VENV:-/work/compat-venv}
COMPAT_TORCH=${COMPAT_TORCH:-2.7.0}  # 2.7: the first with torch.compiler.is_exporting
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
    for candidate in ${COMPAT_PYTHON:-} $(command -v python3.10) $(printf '%s\n' "$root"/versions/3.10.*/bin/python3.10 | sort -rV); do
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
for f in tests/unit/patches/test_compat.py tests/unit/test_registry.py tests/integration/test_registry_cli.py \
         tests/unit/criterions/test_label_smoothed_xent.py \
         tests/unit/lr_schedulers/test_inverse_sqrt_warmup.py tests/integration/test_end_to_end.py \
         tests/unit/models/test_rnn_models.py tests/integration/test_rnn_cli.py tests/unit/models/test_transformer.py tests/integration/test_transformer_cli.py \
         tests/unit/models/test_transformer_defaults.py tests/unit/patches/test_numerical.py; do
    [ -f "$f" ] && tests+=("$f")
done
echo "== pytest on $COMPAT_FAIRSEQ: ${tests[*]}"
log=$(mktemp)
set +e
"$PYTHON" -m pytest -q -p no:cacheprovider -rfEs --durations=5 "${tests[@]}" "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e

# ---- 3. what differs between the two fairseq versions ----
probe=tests/compat/probe.py
facts=$(mktemp -d)
trap 'rm -rf "$log" "$facts"' EXIT
"$PYTHON" "$probe" > "$facts/compat.json" 2>/dev/null
if [ -x "$MAIN_VENV/bin/python" ]; then
    "$MAIN_VENV/bin/python" "$probe" > "$facts/main.json" 2>/dev/null
else
    echo "(no $MAIN_VENV: the comparison column for the usual env is left out)"
    echo '{"facts": {}, "builtin": {}}' > "$facts/main.json"
fi
echo
echo "== differences: $COMPAT_VENV vs $MAIN_VENV (measured by both pythons)"
"$PYTHON" tests/compat/compare.py "$facts/compat.json" "$facts/main.json" "$log"
exit "$status"
