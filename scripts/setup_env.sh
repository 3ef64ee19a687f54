#!/usr/bin/env bash
# Create (or refresh) the suite's virtualenv: torch first, pinned to the CPU wheel on this
# kind of machine (an unpinned torch pulls a multi-GB CUDA build), then the suite.
# Re-running is a no-op until setup.py changes. Usage: source-free, `bash scripts/setup_env.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
stamp="$VENV/.installed-$(cat setup.py | sha1sum | cut -c1-12)"
if [ -f "$stamp" ]; then
    exit 0
fi
echo "== creating $VENV (torch: $TORCH_SPEC); about 4 minutes on a fresh machine"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet --disable-pip-version-check "$TORCH_SPEC"
"$VENV/bin/pip" install --quiet --disable-pip-version-check -e ".[test]"
# fairseq-fixed pulls in torchaudio, whose newest release may not load beside this torch (a CPU
# build: libc10_cuda.so missing); transformers imports it whenever it is installed, and
# translation never uses it: remove it when it cannot load.
"$VENV/bin/python" -c "import torchaudio" >/dev/null 2>&1 || {
    echo "== removing torchaudio: it does not load beside $TORCH_SPEC (transformers would import it)"
    "$VENV/bin/pip" uninstall --quiet --yes torchaudio; }
"$VENV/bin/python" -c "import fairseq_plugins" >/dev/null 2>&1 || {
    echo "error: $VENV: fairseq_plugins does not import after installation" >&2; exit 1; }
rm -f "$VENV"/.installed-*
touch "$stamp"
