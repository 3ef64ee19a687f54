#!/usr/bin/env bash
# Create (or refresh) the suite's virtualenv: torch first, pinned to the CPU wheel on this
# kind of machine (an unpinned torch pulls a multi-GB CUDA build), then the suite.
# Re-running is a no-op until setup.py, TORCH_SPEC or the Python changes. Usage: source-free,
#   bash scripts/setup_env.sh
#   PYTHON=python3.12 VENV=.venv-py3.12 bash scripts/setup_env.sh   # another interpreter
#   TORCH_SPEC="torch==2.7.0 torchaudio==2.7.0" bash scripts/setup_env.sh  # several pins, one string
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
py_version=$("$PYTHON" -c 'import sys; print(".".join(map(str, sys.version_info[:3])))' 2>/dev/null) || {
    echo "error: PYTHON=$PYTHON: not a Python interpreter" >&2; exit 2; }
mkdir -p "$VENV"
exec 9> "$VENV/.setup.lock"
flock 9  # two setups of one venv at once break it: the second waits, then finds the stamp
stamp="$VENV/.installed-$(printf '%s\n' "$(cat setup.py)" "$TORCH_SPEC" "$py_version" | sha1sum | cut -c1-12)"
if [ -f "$stamp" ]; then
    # the page's onnxruntime-web lives outside the venv (a fresh HOME lacks it); its own check is a no-op
    bash scripts/setup_onnx_web.sh || true
    exit 0
fi
# A venv of another Python cannot be upgraded in place: make it again.
if [ -x "$VENV/bin/python" ] && [ "$("$VENV/bin/python" -c 'import platform; print(platform.python_version())' 2>/dev/null)" != "$py_version" ]; then
    echo "== $VENV was made with another Python; recreating it with $py_version"
    rm -rf "$VENV"
fi
echo "== creating $VENV (Python $py_version, torch: $TORCH_SPEC): 3 steps, about 5-8 minutes on a fresh machine"
started=$SECONDS
step() { echo "== step $1/3 ($((SECONDS - started)) s so far): $2"; }
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# The pins also constrain the suite's install, so fairseq's requirements cannot swap torch.
constraints="$VENV/torch-constraints.txt"
read -ra torch_pins <<< "$TORCH_SPEC"
printf '%s\n' "${torch_pins[@]}" > "$constraints"
step 1 "installing torch (the largest download)"
"$VENV/bin/pip" install --quiet --disable-pip-version-check "${torch_pins[@]}"
step 2 "installing fairseq, the suite and its test tools"
"$VENV/bin/pip" install --quiet --disable-pip-version-check -c "$constraints" -e ".[test]"
# fairseq-fixed pulls in torchaudio, whose newest release may not load beside this torch (a CPU
# build: libc10_cuda.so missing); transformers imports it whenever it is installed, and
# translation never uses it. The suite's commands hide it themselves (fairseq_plugins/
# torchaudio_guard.py, tested in a venv made by plain pip); the tests also import transformers
# directly, as users' scripts do, so this venv goes without it when it cannot load.
"$VENV/bin/python" -c "import torchaudio" >/dev/null 2>&1 || {
    echo "== removing torchaudio: it does not load beside $TORCH_SPEC (transformers would import it)"
    "$VENV/bin/pip" uninstall --quiet --yes torchaudio; }
# onnxruntime-web (npm) for the page fairseq-plugins-export-onnx writes; without it the page test
# fails naming this script, so a failed npm (its one error line above) does not stop the rest
step 3 "onnxruntime-web for the ONNX page (npm)"
bash scripts/setup_onnx_web.sh || true
"$VENV/bin/python" -c "import fairseq_plugins" >/dev/null 2>&1 || {
    echo "error: $VENV: fairseq_plugins does not import after installation" >&2; exit 1; }
rm -f "$VENV"/.installed-*
touch "$stamp"
echo "== $VENV ready in $((SECONDS - started)) s"
