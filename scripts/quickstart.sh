#!/usr/bin/env bash
# README command #1: create the virtualenv if needed, then train and evaluate every model
# family on the embedded corpus, each on its own update budget, two at a time (docs/RESULTS.md,
# Quickstart: the budgets, the table and the time; the budget is updates, not minutes, so a
# slower or busier CPU takes longer for the same table). Re-running skips finished steps.
# Arguments go to scripts/quickstart.py (e.g. --models rnnsearch_tiny --max-update 500).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec "${VENV:-.venv}/bin/python" scripts/quickstart.py "$@"
