#!/usr/bin/env bash
# newstest2014 scores of a Transformer trained by train_transformer_{base,big}.sh: average
# the last 5 (base) / 20 (big) checkpoints, beam 4 with length penalty 0.6, output length up
# to source length + 50, then detokenized SacreBLEU (with signature) and the paper's
# tokenized BLEU with compound splitting (Vaswani et al. 2017, Table 2).
# Usage: [SAVE_DIR=...] [DATA=...] [DRY_RUN=1] bash evaluate.sh transformer_base|transformer_big
# (environment variables: see ../common/evaluate_steps.sh and README.md)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../common/evaluate_steps.sh source-path=SCRIPTDIR
source "$HERE/../common/evaluate_steps.sh"

SRC=en
TGT=de
case ${1:-} in
    transformer_base) n_average=5 ;;
    transformer_big) n_average=20 ;;
    *) die "usage: bash ${0##*/} transformer_base|transformer_big (got '${1:-}')" ;;
esac
evaluate_setup "wmt14_en_de_$1" "$PWD/wmt14_en_de/data-bin/bpe"
evaluate_subword "$n_average"
