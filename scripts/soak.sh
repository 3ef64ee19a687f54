#!/usr/bin/env bash
# Memory soak (outside CI): 30 minutes of fairseq-train with validation and checkpoints, RSS
# sampled every minute; writes work/soak/memory.{md,png,csv}. Arguments go to scripts/soak.py.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec "${VENV:-.venv}/bin/python" scripts/soak.py "$@"
