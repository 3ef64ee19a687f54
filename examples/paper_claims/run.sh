#!/usr/bin/env bash
# Reproduce the papers' claims at small scale on two corpora, 3 seeds each (run.py --help for the options).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup_env.sh
exec "${VENV:-.venv}/bin/python" examples/paper_claims/run.py "$@"
