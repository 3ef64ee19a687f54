#!/usr/bin/env bash
# newstest2014 scores of a model trained by one of the train_*.sh scripts here:
#   transformer_big            average of the last 20 checkpoints, beam 4, length penalty 0.6,
#                              detokenized SacreBLEU and tokenized BLEU (Vaswani et al. 2017)
#   rnnsearch | rnnencdec      checkpoint_best.pt of the VARIANT=30|50 run (default 50), beam 12,
#                              SacreBLEU, tokenized BLEU on all sentences and without unknown
#                              words (Bahdanau et al. 2015, Table 1), BLEU by source length (Fig. 2)
#   seq2seq_lstm               checkpoint_best.pt, beam 12, the same scores (Sutskever et al. 2014)
# Usage: [VARIANT=30|50] [SAVE_DIR=...] [DATA=...] [DRY_RUN=1] bash evaluate.sh MODEL
# (environment variables: see ../common/evaluate_steps.sh and README.md)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../common/evaluate_steps.sh source-path=SCRIPTDIR
source "$HERE/../common/evaluate_steps.sh"

SRC=en
TGT=fr
VARIANT=${VARIANT:-50}
[[ $VARIANT == 30 || $VARIANT == 50 ]] || die "VARIANT must be 30 or 50, got '$VARIANT'"
case ${1:-} in
    transformer_big)
        evaluate_setup wmt14_en_fr_transformer_big "$PWD/wmt14_en_fr/data-bin/bpe"
        evaluate_subword 20
        ;;
    rnnsearch | rnnencdec)
        evaluate_setup "wmt14_en_fr_$1$VARIANT" "$PWD/wmt14_en_fr/data-bin/words30k"
        evaluate_words
        ;;
    seq2seq_lstm)
        evaluate_setup wmt14_en_fr_seq2seq_lstm "$PWD/wmt14_en_fr/data-bin/words160k"
        evaluate_words
        ;;
    *) die "usage: bash ${0##*/} transformer_big|rnnsearch|rnnencdec|seq2seq_lstm (got '${1:-}')" ;;
esac
