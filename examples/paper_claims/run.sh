#!/usr/bin/env bash
# Reproduce the papers' claims at small scale (under 60 minutes on 2 quiet cores with the defaults).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup_env.sh
exec "${VENV:-.venv}/bin/python" examples/paper_claims/run.py "$@"
