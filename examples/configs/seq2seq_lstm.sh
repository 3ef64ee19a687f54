#!/usr/bin/env bash
# Sequence to sequence deep LSTM (Sutskever et al., 2014, section 3.4) as fairseq-train flags.
#
#   examples/configs/seq2seq_lstm.sh DATA_BIN [more fairseq-train flags, which override these]
#
# Paper: 4 layers x 1000 cells, 1000-dim embeddings, uniform [-0.08, 0.08] init, source
# reversed (the model's default; --no-reverse-source turns it off), plain SGD at lr 0.7,
# halved every half epoch after 5 epochs (--lr-scheduler sutskever_halving), 7.5 epochs,
# batches of 128 sentences, gradient norm clipped at 5 after dividing the cost by 128
# (--sentence-avg). fairseq stops at whole epochs: to stop at 7.5 pass
# --max-update 7.5 x (updates per epoch, logged at the end of epoch 1).
# Vocabulary: 160k source / 80k target words (--nwordssrc 160000 --nwordstgt 80000 at
# preprocessing, separate dictionaries).
# The flags are examples/common/train_recipes.sh's seq2seq_recipe, as for the WMT'14 pipelines.
set -euo pipefail
# shellcheck source=../common/train_recipes.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/../common/train_recipes.sh"
DATA=${1:?usage: $0 DATA_BIN [fairseq-train flags]}
shift
train_setup seq2seq_lstm "$DATA"
seq2seq_recipe "$@"
