#!/usr/bin/env bash
# RNNsearch-50 / RNNsearch-30 (Bahdanau et al., 2015, appendix B.2) as fairseq-train flags;
# the paper trains its RNNencdec baseline the same way (ARCH=rnnencdec, see rnnencdec.sh).
#
#   examples/configs/rnnsearch.sh DATA_BIN [more fairseq-train flags, which override these]
#   MAXLEN=30 examples/configs/rnnsearch.sh DATA_BIN      # RNNsearch-30
#
# DATA_BIN: fairseq-preprocess output with the paper's 30k shortlist per language, e.g.
#   fairseq-preprocess --source-lang en --target-lang fr --nwordssrc 30000 --nwordstgt 30000 ...
# Paper: Adadelta (rho 0.95, eps 1e-6; torch's Adadelta takes lr 1.0 for the original rule),
# 80 sentences per minibatch, gradient L2 norm clipped at 1 on the per-sentence mean cost
# (--sentence-avg), sentences of up to MAXLEN words (fairseq counts the EOS: MAXLEN + 1 tokens),
# plain maximum likelihood (no label smoothing), the paper's initialisation (appendix B.1,
# --init paper; the models' default is PyTorch's, which suits short Adam runs). fairseq's batches are already made of
# sentences of similar length (the paper sorts 1600 pairs every 20 updates). No dropout.
# The flags are examples/common/train_recipes.sh's rnn_recipe, as for the WMT'14 pipelines.
set -euo pipefail
# shellcheck source=../common/train_recipes.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/../common/train_recipes.sh"
DATA=${1:?usage: $0 DATA_BIN [fairseq-train flags]}
shift
MAXLEN=${MAXLEN:-50}
ARCH=${ARCH:-rnnsearch}
train_setup "$ARCH-$MAXLEN" "$DATA"
rnn_recipe "$ARCH" "$MAXLEN" "$@"
