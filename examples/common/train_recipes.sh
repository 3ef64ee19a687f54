# shellcheck shell=bash
# The papers' training recipes as fairseq-train flags (examples/wmt14_en_*/train_*.sh).
# Sourced, never run: the caller sets `set -euo pipefail` (and SRC and TGT, unless fairseq
# can tell the languages from DATA alone), calls train_setup, then one
# *_recipe function with its own arguments and "$@" (extra fairseq-train flags, which come
# last and so override the recipe's: argparse keeps the last value of a repeated flag).
#
# Environment:
#   DATA        binarized data (default: the pair's prepare.sh output under $PWD)
#   SAVE_DIR    checkpoints and train.log (default: $PWD/checkpoints/<run name>)
#   MAX_TOKENS  tokens per GPU batch for the Transformer (default 3584: 16 GB GPUs in fp16)
#   LAUNCHER    command to start fairseq-train under, e.g. for several nodes
#               "torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500"
#   NUM_GPUS, PRECISION, USER_DIR, DRY_RUN: see lib.sh (DRY_RUN=1 also prints the resolved
#   batch arithmetic)

# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# train_setup RUN_NAME DEFAULT_DATA: DATA, SAVE_DIR, NUM_GPUS, DEVICE_FLAGS, USER_DIR.
train_setup() {
    DATA=${DATA:-$2}
    SAVE_DIR=${SAVE_DIR:-$PWD/checkpoints/$1}
    detect_gpus
    device_flags
    find_user_dir
    if [[ ${DRY_RUN:-0} != 1 ]]; then
        if [[ -n ${SRC:-} ]]; then
            [[ -f $DATA/dict.$SRC.txt && -f $DATA/dict.$TGT.txt ]] || die "no binarized $SRC-$TGT data in $DATA (run prepare.sh, or set DATA)"
        else
            [[ -d $DATA ]] || die "no such data directory: $DATA"
        fi
    fi
}

# run_train FLAG...: run (or with DRY_RUN=1 print) fairseq-train on DATA with the flags.
run_train() {
    local cmd=() prev=""
    # A --save-dir among the flags overrides SAVE_DIR for the log file and the folder too.
    for flag in "$@"; do
        if [[ $prev == --save-dir ]]; then SAVE_DIR=$flag; fi
        if [[ $flag == --save-dir=* ]]; then SAVE_DIR=${flag#--save-dir=}; fi
        prev=$flag
    done
    if [[ -n ${LAUNCHER:-} ]]; then
        read -r -a cmd <<<"$LAUNCHER"
        cmd+=("$(command -v fairseq-train)")
    else
        cmd=(fairseq-train)
    fi
    cmd+=("$DATA" --user-dir "$USER_DIR")
    [[ -z ${SRC:-} ]] || cmd+=(--source-lang "$SRC" --target-lang "$TGT")
    cmd+=(--save-dir "$SAVE_DIR" --log-file "$SAVE_DIR/train.log" --log-format simple --log-interval 100
        "${DEVICE_FLAGS[@]}")
    ((NUM_GPUS <= 1)) || cmd+=(--distributed-world-size "$NUM_GPUS")
    cmd+=("$@")
    if [[ ${DRY_RUN:-0} != 1 ]]; then
        mkdir -p "$SAVE_DIR"
        log "training into $SAVE_DIR (rerun the same command to resume from checkpoint_last.pt)"
    fi
    run_or_print "${cmd[@]}"
}

# batch_note TEXT: the resolved batch arithmetic, on stdout in a dry run, else in the log.
batch_note() {
    if [[ ${DRY_RUN:-0} == 1 ]]; then echo "# $*"; else log "$*"; fi
}

# transformer_recipe ARCH DROPOUT MAX_UPDATE SAVE_EVERY KEEP [fairseq-train flags...]
# Vaswani et al. (2017) §5: Adam (0.9, 0.98, 1e-9), lr = d_model^-0.5 * min(step^-0.5,
# step * 4000^-1.5), label smoothing 0.1, ~25000 source and ~25000 target tokens per step.
# Checkpoints every SAVE_EVERY updates (the paper: every 10 minutes), the last KEEP kept for
# averaging (5 for base, 20 for big).
# d_model (the schedule's --model-dim) is the architecture's: 512 for *_base, 1024 for *_big.
transformer_recipe() {
    local arch=$1 dropout=$2 max_update=$3 save_every=$4 keep=$5 d_model
    shift 5
    case $arch in
        *_base) d_model=512 ;;
        *_big) d_model=1024 ;;
        *) die "transformer_recipe: no d_model known for --arch $arch (vaswani_transformer_base or _big)" ;;
    esac
    MAX_TOKENS=${MAX_TOKENS:-3584}
    require_uint MAX_TOKENS
    local max_tokens=$MAX_TOKENS target=25000 devices update_freq
    devices=$((NUM_GPUS > 0 ? NUM_GPUS : 1))
    # --max-tokens bounds max(source, target) tokens of a GPU batch, padding included.
    update_freq=$(((target + max_tokens * devices / 2) / (max_tokens * devices)))
    ((update_freq >= 1)) || update_freq=1
    batch_note "$arch on $NUM_GPUS GPU(s): --max-tokens $max_tokens x $devices device(s) x --update-freq $update_freq" \
        "= $((max_tokens * devices * update_freq)) tokens per side per update (paper: ~$target)"
    run_train --arch "$arch" --share-all-embeddings --dropout "$dropout" \
        --optimizer adam --adam-betas '(0.9, 0.98)' --adam-eps 1e-9 --weight-decay 0.0 --clip-norm 0.0 \
        --lr 1 --lr-scheduler inverse_sqrt_warmup --model-dim "$d_model" --warmup-updates 4000 \
        --criterion label_smoothed_xent --label-smoothing 0.1 \
        --max-tokens "$max_tokens" --update-freq "$update_freq" --max-update "$max_update" \
        --save-interval-updates "$save_every" --keep-interval-updates "$keep" --no-epoch-checkpoints \
        "$@"
}

# sentence_batch SENTENCES: sets BATCH_SIZE (sentences per GPU) so that BATCH_SIZE x devices
# is the paper's number of sentences per update (rounded up when it does not divide).
sentence_batch() {
    local sentences=$1 devices
    devices=$((NUM_GPUS > 0 ? NUM_GPUS : 1))
    BATCH_SIZE=$(((sentences + devices - 1) / devices))
    local note="--batch-size $BATCH_SIZE x $devices device(s) = $((BATCH_SIZE * devices)) sentences per update (paper: $sentences)"
    ((BATCH_SIZE * devices == sentences)) || note+="; $sentences does not split evenly over $devices devices"
    batch_note "$note"
}

# rnn_recipe ARCH MAX_WORDS [fairseq-train flags...]
# Bahdanau et al. (2015) appendix B.2, for RNNsearch and the RNNencdec baseline: Adadelta
# (rho 0.95, eps 1e-6), 80 sentences per update, gradient norm clipped at 1, the loss of a
# batch averaged over its sentences; trained on pairs of up to MAX_WORDS words (-30, -50);
# the paper's initialisation (appendix B.1: --init paper; the models' default is PyTorch's).
rnn_recipe() {
    local arch=$1 max_words=$2
    shift 2
    sentence_batch 80
    # fairseq counts the </s> every sentence ends with: MAX_WORDS words + </s>.
    run_train --arch "$arch" --init paper \
        --optimizer adadelta --adadelta-rho 0.95 --adadelta-eps 1e-6 --lr 1.0 --clip-norm 1.0 \
        --criterion cross_entropy --sentence-avg \
        --batch-size "$BATCH_SIZE" --max-source-positions $((max_words + 1)) --max-target-positions $((max_words + 1)) \
        --skip-invalid-size-inputs-valid-test \
        --save-interval-updates 5000 --keep-interval-updates 1 \
        "$@"
}

# seq2seq_recipe [fairseq-train flags...]
# Sutskever et al. (2014) §3.4: uniform [-0.08, 0.08] init (the model's default), plain SGD
# at lr 0.7, halved every half epoch after 5 epochs, 128 sentences per batch, gradient norm
# (of the loss averaged over the batch's sentences) clipped at 5.
seq2seq_recipe() {
    sentence_batch 128
    run_train --arch seq2seq_lstm --init paper \
        --optimizer sgd --momentum 0.0 --lr 0.7 --clip-norm 5.0 \
        --lr-scheduler sutskever_halving --halve-after-epochs 5 --halve-every-epochs 0.5 \
        --criterion cross_entropy --sentence-avg \
        --batch-size "$BATCH_SIZE" --max-epoch 8 \
        --save-interval-updates 5000 --keep-interval-updates 1 \
        "$@"
}
