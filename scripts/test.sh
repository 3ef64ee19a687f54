#!/usr/bin/env bash
# README command #2: the whole test suite (installs Debian's Chromium and creates the virtualenv first if
# needed).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"`. Two pytest-xdist workers, one
# per core, each running whole files (module fixtures stay in one worker; conftest's session fixtures are
# built once and shared); PYTEST_WORKERS=0 runs everything in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_chromium.sh
bash scripts/setup_env.sh
VENV=${VENV:-.venv}
export PATH="$PWD/$VENV/bin:$PATH"  # the tests call fairseq-* and shellcheck from the venv
exec "$VENV/bin/python" -m pytest -q -rfEs -p no:cacheprovider --durations=25 -n "${PYTEST_WORKERS:-2}" --dist loadfile "$@"
