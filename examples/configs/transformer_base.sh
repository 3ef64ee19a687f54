#!/usr/bin/env bash
# Transformer base / big (Vaswani et al., 2017, §5, Table 3) as fairseq-train flags.
#
#   examples/configs/transformer_base.sh DATA_BIN [more fairseq-train flags, which override these]
#   SIZE=big examples/configs/transformer_base.sh DATA_BIN      # Transformer (big)
#
# DATA_BIN: fairseq-preprocess output with one shared BPE vocabulary (--joined-dictionary),
# which --share-all-embeddings needs (§3.4: one matrix for both embeddings and the softmax).
# Paper: Adam (beta1 0.9, beta2 0.98, eps 1e-9); lr = d_model^-0.5 * min(step^-0.5,
# step * 4000^-1.5) (--lr-scheduler inverse_sqrt_warmup --model-dim D --lr 1: --lr is the
# scale of the formula when --model-dim is given); label smoothing 0.1; batches of ~25k source
# + ~25k target tokens: --max-tokens (MAX_TOKENS, default 3584) x GPUs x --update-freq ~ 25000,
# --update-freq computed for the GPUs found; 100k updates (base) or 300k (big), a checkpoint
# every ~10 minutes, the last 5 (base) / 20 (big) averaged. The flags are
# examples/common/train_recipes.sh's transformer_recipe, as for the WMT'14 pipelines
# (environment variables: see there; DRY_RUN=1 prints the command).
#
# Then, averaging and decoding as in the paper (beam 4, Wu et al.'s length penalty 0.6,
# output at most source length + 50):
#   fairseq-plugins-average --inputs checkpoints/transformer-base --num-update-checkpoints 5 \
#       --output checkpoints/transformer-base/averaged.pt
#   fairseq-generate DATA_BIN --user-dir fairseq_plugins --path checkpoints/transformer-base/averaged.pt \
#       --task translation_wu --wu-lenpen 0.6 --beam 4 --max-len-a 1 --max-len-b 50 \
#       --remove-bpe --batch-size 128
# (fairseq's own --lenpen divides by |Y|^alpha, not by ((5 + |Y|) / 6)^alpha: keep it at 1.)
set -euo pipefail
# shellcheck source=../common/train_recipes.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/../common/train_recipes.sh"
DATA=${1:?usage: $0 DATA_BIN [fairseq-train flags]}
shift
SIZE=${SIZE:-base}
case "$SIZE" in
    base) DROPOUT=0.1 MAX_UPDATE=100000 SAVE_EVERY=1500 KEEP=5 ;;
    big) DROPOUT=0.3 MAX_UPDATE=300000 SAVE_EVERY=600 KEEP=20 ;;
    *) die "SIZE must be base or big, not '$SIZE'" ;;
esac
train_setup "transformer-$SIZE" "$DATA"
transformer_recipe "vaswani_transformer_$SIZE" "$DROPOUT" "$MAX_UPDATE" "$SAVE_EVERY" "$KEEP" "$@"
