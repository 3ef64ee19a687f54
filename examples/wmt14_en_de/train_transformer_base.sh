#!/usr/bin/env bash
# Transformer base (Vaswani et al. 2017, Table 3 "base") on WMT'14 En-De: 100k updates of
# ~25k+25k tokens, a checkpoint every 1500 updates (~10 min at the paper's 0.4 s/step) and
# the last 5 kept for evaluate.sh, which averages them.
# Usage: [DATA=...] [SAVE_DIR=...] [NUM_GPUS=...] [DRY_RUN=1] bash train_transformer_base.sh [fairseq-train flags]
# (environment variables: see ../common/train_recipes.sh and README.md)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../common/train_recipes.sh source-path=SCRIPTDIR
source "$HERE/../common/train_recipes.sh"

SRC=en
TGT=de
train_setup wmt14_en_de_transformer_base "$PWD/wmt14_en_de/data-bin/bpe"
transformer_recipe vaswani_transformer_base 0.1 100000 1500 5 "$@"
