# shellcheck shell=bash
# Evaluation on newstest2014 (examples/wmt14_en_*/evaluate.sh): checkpoint averaging,
# fairseq-generate, detokenization and the papers' scores. Sourced, never run: the caller
# sets `set -euo pipefail`, SRC and TGT, then calls evaluate_subword or evaluate_words.
#
# Environment:
#   DATA        binarized data the model was trained on (default: as the train script)
#   SAVE_DIR    the training run's checkpoints (default: as the train script)
#   CHECKPOINT  evaluate this checkpoint file instead (no averaging)
#   RESULTS     where the outputs go (default: SAVE_DIR/newstest2014)
#   BEAM        beam size (default: 4 for the Transformer, 12 for the RNNs)
#   GEN_MAX_TOKENS  tokens per generation batch (default 8000)
#   NUM_GPUS, PRECISION, USER_DIR, DRY_RUN: see lib.sh

# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# The paper's length penalty, Wu et al. (2016): score = log P / ((5 + |Y|) / 6)^0.6, from the
# suite's translation_wu task (fairseq's own --lenpen divides by |Y|^alpha instead).
TRANSFORMER_LENPEN=(--task translation_wu --wu-lenpen 0.6)

# evaluate_setup RUN_NAME DEFAULT_DATA
evaluate_setup() {
    DATA=${DATA:-$2}
    SAVE_DIR=${SAVE_DIR:-$PWD/checkpoints/$1}
    RESULTS=${RESULTS:-$SAVE_DIR/newstest2014}
    RUN_NAME=$1
    detect_gpus
    device_flags
    # fairseq-generate takes --fp16 but has no use for --amp: amp/fp32 generate in fp32.
    if [[ ${DEVICE_FLAGS[*]-} == --amp ]]; then DEVICE_FLAGS=(); fi
    find_user_dir
    if [[ ${DRY_RUN:-0} != 1 ]]; then
        [[ -f $DATA/dict.$SRC.txt && -f $DATA/newstest2014.raw.$TGT ]] || die "no binarized $SRC-$TGT data with newstest2014 in $DATA (run prepare.sh, or set DATA)"
        mkdir -p "$RESULTS"
    fi
}

# average_last N: CHECKPOINT = the average of the last N interval checkpoints (made once;
# made again when training has gone on since).
average_last() {
    local n=$1
    if [[ -n ${CHECKPOINT:-} ]]; then
        log "evaluating $CHECKPOINT (no averaging)"
        return
    fi
    CHECKPOINT=$SAVE_DIR/average_last_$n.pt
    if [[ ${DRY_RUN:-0} != 1 ]]; then
        [[ -f $SAVE_DIR/checkpoint_last.pt ]] || die "no checkpoints in $SAVE_DIR (train first, or set SAVE_DIR / CHECKPOINT)"
        if [[ -f $CHECKPOINT && $CHECKPOINT -nt $SAVE_DIR/checkpoint_last.pt ]]; then
            log "skip averaging: $CHECKPOINT is newer than checkpoint_last.pt"
            return
        fi
        log "averaging the last $n checkpoints of $SAVE_DIR"
    fi
    run_or_print fairseq-plugins-average --inputs "$SAVE_DIR" --num-update-checkpoints "$n" --output "$CHECKPOINT"
}

# generate BEAM [fairseq-generate flags...]: RESULTS/generate-test.txt, then
# RESULTS/hyp.tok (tokenized hypotheses in test-set order) and RESULTS/hyp.detok.
generate() {
    local beam=${BEAM:-$1}
    shift
    [[ ${DRY_RUN:-0} == 1 || -f $CHECKPOINT ]] || die "no checkpoint: $CHECKPOINT"
    run_or_print fairseq-generate "$DATA" --user-dir "$USER_DIR" --source-lang "$SRC" --target-lang "$TGT" \
        --path "$CHECKPOINT" --gen-subset test --beam "$beam" \
        --max-tokens "${GEN_MAX_TOKENS:-8000}" --results-path "$RESULTS" "${DEVICE_FLAGS[@]}" "$@"
    if [[ ${DRY_RUN:-0} == 1 ]]; then
        echo "# hypotheses: the D- lines of $RESULTS/generate-test.txt in sentence order -> $RESULTS/hyp.tok"
    else
        sed -n 's/^D-\([0-9]*\)\t[^\t]*\t\{0,1\}/\1\t/p' "$RESULTS/generate-test.txt" | sort -t$'\t' -k1,1n | cut -f2- >"$RESULTS/hyp.tok"
        local n_hyp n_ref
        n_hyp=$(wc -l <"$RESULTS/hyp.tok")
        n_ref=$(wc -l <"$DATA/newstest2014.raw.$TGT")
        # fairseq-fixed without the suite's compat drops the last batch (fairseq issue #5036)
        ((n_hyp == n_ref)) || die "$RESULTS/generate-test.txt has $n_hyp hypotheses but $DATA/newstest2014.raw.$TGT has $n_ref references"
    fi
    run_or_print fairseq-plugins-tokenize detokenize -l "$TGT" -i "$RESULTS/hyp.tok" -o "$RESULTS/hyp.detok"
}

# Detokenized SacreBLEU (with its signature) and chrF against the raw references, and the
# tokenized BLEU with compound splitting (Vaswani et al.'s En-De number): RESULTS/score.md.
score_detokenized() {
    run_or_print fairseq-plugins-score --hyp "$RUN_NAME=$RESULTS/hyp.detok" --ref "$DATA/newstest2014.raw.$TGT" \
        --lang "$TGT" --out "$RESULTS/score"
}

# evaluate_subword N_AVERAGE: a Transformer on joined BPE or sentencepiece data.
evaluate_subword() {
    average_last "$1"
    local remove_bpe=--remove-bpe
    [[ ! -f $DATA/spm.model ]] || remove_bpe=--remove-bpe=sentencepiece
    generate 4 "${TRANSFORMER_LENPEN[@]}" --max-len-a 1 --max-len-b 50 "$remove_bpe"
    score_detokenized
}

# evaluate_words: a word-level RNN (best checkpoint) plus Bahdanau et al.'s analyses: BLEU
# on all sentences and on those without unknown words (Table 1) and by length (Figure 2),
# on the tokenized text as the paper scored it (multi-bleu: --tokenize none).
evaluate_words() {
    CHECKPOINT=${CHECKPOINT:-$SAVE_DIR/checkpoint_best.pt}
    # Training capped the positions at the -30/-50 length: lift the cap for the test set.
    generate 12 --model-overrides "{'max_source_positions': 1024, 'max_target_positions': 1024}"
    score_detokenized
    local plain=(--hyp "$RUN_NAME=$RESULTS/hyp.tok" --src "$DATA/newstest2014.tok.$SRC" --ref "$DATA/newstest2014.tok.$TGT")
    run_or_print fairseq-plugins-nounk-bleu "${plain[@]}" --src-vocab "$DATA/dict.$SRC.txt" --tgt-vocab "$DATA/dict.$TGT.txt" \
        --tokenize none --out "$RESULTS/nounk"
    # Bahdanau et al.'s 10-word buckets of Fig. 2 (the tool's default buckets come from the data)
    run_or_print fairseq-plugins-bleu-by-length "${plain[@]}" --buckets 0,10,20,30,40,50,60,70,80 --tokenize none \
        --out "$RESULTS/bleu_by_length"
    [[ ${DRY_RUN:-0} == 1 ]] || log "results: $RESULTS/{score,nounk,bleu_by_length}.{md,png}"
}
