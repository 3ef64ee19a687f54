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
# plain maximum likelihood (no label smoothing). fairseq's batches are already made of
# sentences of similar length (the paper sorts 1600 pairs every 20 updates). No dropout.
set -euo pipefail
DATA=${1:?usage: $0 DATA_BIN [fairseq-train flags]}
shift
MAXLEN=${MAXLEN:-50}
ARCH=${ARCH:-rnnsearch}
USER_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../fairseq_plugins" && pwd)
exec fairseq-train "$DATA" --user-dir "$USER_DIR" \
    --arch "$ARCH" \
    --optimizer adadelta --lr 1.0 --adadelta-rho 0.95 --adadelta-eps 1e-6 \
    --batch-size 80 --clip-norm 1 --sentence-avg \
    --criterion cross_entropy \
    --max-source-positions $((MAXLEN + 1)) --max-target-positions $((MAXLEN + 1)) \
    --skip-invalid-size-inputs-valid-test \
    --save-dir "checkpoints/$ARCH-$MAXLEN" \
    "$@"
