#!/usr/bin/env bash
# The RNNencdec baseline of Bahdanau et al. (2015) (Cho et al. 2014's encoder-decoder) on WMT'14 En-Fr with 30k-word
# vocabularies: RNNencdec-30 or -50 (VARIANT=30|50, default 50: trained on pairs of up to
# that many words), Adadelta, 80 sentences per update, clip-norm 1. The paper trained each
# model for about 5 days; stop it (or pass --max-update N) when the validation loss stalls.
# Usage: [VARIANT=30|50] [DATA=...] [SAVE_DIR=...] [NUM_GPUS=...] [DRY_RUN=1] bash train_rnnencdec.sh [fairseq-train flags]
# (environment variables: see ../common/train_recipes.sh and README.md)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../common/train_recipes.sh source-path=SCRIPTDIR
source "$HERE/../common/train_recipes.sh"

SRC=en
TGT=fr
VARIANT=${VARIANT:-50}
[[ $VARIANT == 30 || $VARIANT == 50 ]] || die "VARIANT must be 30 or 50 (RNNencdec-30/-50), got '$VARIANT'"
train_setup "wmt14_en_fr_rnnencdec$VARIANT" "$PWD/wmt14_en_fr/data-bin/words30k"
rnn_recipe rnnencdec "$VARIANT" "$@"
