#!/usr/bin/env bash
# Transformer big (Vaswani et al. 2017, Table 3 "big") on WMT'14 En-De: d_model 1024, dropout
# 0.3, 300k updates of ~25k+25k tokens, a checkpoint every 600 updates (~10 min at the paper's
# 1.0 s/step) and the last 20 kept for evaluate.sh, which averages them.
# Usage: [DATA=...] [SAVE_DIR=...] [NUM_GPUS=...] [DRY_RUN=1] bash train_transformer_big.sh [fairseq-train flags]
# (environment variables: see ../common/train_recipes.sh and README.md)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../common/train_recipes.sh source-path=SCRIPTDIR
source "$HERE/../common/train_recipes.sh"

SRC=en
TGT=de
train_setup wmt14_en_de_transformer_big "$PWD/wmt14_en_de/data-bin/bpe"
transformer_recipe vaswani_transformer_big 0.3 300000 600 20 "$@"
