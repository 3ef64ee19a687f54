#!/usr/bin/env bash
# Transformer big (Vaswani et al. 2017) on WMT'14 En-Fr: as for En-De but with dropout 0.1
# ("The Transformer (big) model trained for English-to-French used dropout rate 0.1"):
# 300k updates of ~25k+25k tokens, a checkpoint every 600 updates, the last 20 averaged.
# Usage: [DATA=...] [SAVE_DIR=...] [NUM_GPUS=...] [DRY_RUN=1] bash train_transformer_big.sh [fairseq-train flags]
# (environment variables: see ../common/train_recipes.sh and README.md)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../common/train_recipes.sh source-path=SCRIPTDIR
source "$HERE/../common/train_recipes.sh"

SRC=en
TGT=fr
train_setup wmt14_en_fr_transformer_big "$PWD/wmt14_en_fr/data-bin/bpe"
transformer_recipe vaswani_transformer_big 0.1 300000 600 20 "$@"
