#!/usr/bin/env bash
# README command #1: create the virtualenv if needed, then train and evaluate every model
# family on the embedded corpus, 800 updates each (about 20 minutes on 2 quiet cores, more on a
# slower or busier CPU: the budget is updates, not minutes). Re-running skips finished steps.
# Arguments go to scripts/quickstart.py (e.g. --models rnnsearch_tiny --max-update 500).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec "${VENV:-.venv}/bin/python" scripts/quickstart.py "$@"
