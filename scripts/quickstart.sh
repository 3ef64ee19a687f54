#!/usr/bin/env bash
# README command #1: create the virtualenv if needed, then train and evaluate every model
# family on the embedded corpus (about 15 minutes on 2 cores). Re-running skips finished steps.
# Arguments go to scripts/quickstart.py (e.g. --models rnnsearch_tiny --max-update 500).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec "${VENV:-.venv}/bin/python" scripts/quickstart.py "$@"
