# shellcheck shell=bash
# The prepare steps of the WMT'14 pipelines (examples/wmt14_en_{de,fr}/prepare.sh).
# Sourced, never run: the caller sets `set -euo pipefail` and the corpus tables (SRC, TGT,
# ARCHIVES, TRAIN_CORPORA, VALID_SETS, TEST_SET, DATA_DEFAULT, BPE_MERGES_DEFAULT,
# SPM_VOCAB_DEFAULT, PAIR_USAGE) before calling prepare_run "$@".

# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

prepare_usage() {
    cat <<EOF
Usage: bash ${0##*/} [options]

Downloads the WMT'14 ${SRC}-${TGT} corpora and newstest sets, normalises and tokenizes them
(sacremoses), cleans the training pairs (1-250 tokens, ratio 1.5), learns a joint subword
model and binarizes with fairseq-preprocess. Every step is skipped when its output exists,
so a rerun after a failure resumes at the failed step.

Options (environment variable in brackets):
  --out-dir DIR      everything is written under DIR [WMT14_OUT] (default: ./wmt14_${SRC}_${TGT})
  --raw-dir DIR      where the archives are, or are downloaded to [WMT14_RAW] (default: OUT/raw)
  --offline          never download: a missing archive is an error [WMT14_OFFLINE=1]
  --mirror URL       fetch each archive as URL/<archive name> (http/https with curl or wget; file:// copied)
                     instead of statmt.org [WMT14_MIRROR]
  --no-md5           do not check the archives' md5 sums [WMT14_MD5=0]
  --data LIST        binarized sets to build, comma-separated, among: joined (subword units,
                     one dictionary, for the Transformer), words30k (30k-word vocabularies,
                     RNNsearch/RNNencdec), words160k (160k/80k words, seq2seq LSTM)
                     [WMT14_DATA] (default: ${DATA_DEFAULT})
  --bpe-merges N     joint BPE merge operations [BPE_MERGES] (default: ${BPE_MERGES_DEFAULT})
  --spm              a joint sentencepiece model instead of BPE for 'joined'
  --spm-vocab N      sentencepiece vocabulary size [SPM_VOCAB] (default: ${SPM_VOCAB_DEFAULT})
  --workers N        processes for tokenization, BPE and binarization [WORKERS] (default: nproc)
${PAIR_USAGE:-}
Output: OUT/data-bin/{bpe|spm,words30k,words160k}/ ready for fairseq-train; each also holds
newstest2014.raw.{${SRC},${TGT}} (untokenized, for SacreBLEU) and newstest2014.tok.{${SRC},${TGT}}.
EOF
}

# Parse the options common to both pairs; sets the globals used by prepare_run.
prepare_parse_args() {
    OUT=${WMT14_OUT:-$PWD/wmt14_${SRC}_${TGT}}
    RAW_DIR=${WMT14_RAW:-}
    OFFLINE=${WMT14_OFFLINE:-0}
    MIRROR=${WMT14_MIRROR:-}
    CHECK_MD5=${WMT14_MD5:-1}
    DATA_KINDS=${WMT14_DATA:-$DATA_DEFAULT}
    BPE_MERGES=${BPE_MERGES:-$BPE_MERGES_DEFAULT}
    SPM_VOCAB=${SPM_VOCAB:-$SPM_VOCAB_DEFAULT}
    USE_SPM=0
    WORKERS=${WORKERS:-$(nproc 2>/dev/null || echo 1)}
    while (($#)); do
        case $1 in
            --out-dir) OUT=${2:?--out-dir needs a directory}; shift 2 ;;
            --raw-dir) RAW_DIR=${2:?--raw-dir needs a directory}; shift 2 ;;
            --offline) OFFLINE=1; shift ;;
            --mirror) MIRROR=${2:?--mirror needs a URL}; shift 2 ;;
            --no-md5) CHECK_MD5=0; shift ;;
            --data) DATA_KINDS=${2:?--data needs a list}; shift 2 ;;
            --bpe-merges) BPE_MERGES=${2:?--bpe-merges needs a number}; shift 2 ;;
            --spm) USE_SPM=1; shift ;;
            --spm-vocab) SPM_VOCAB=${2:?--spm-vocab needs a number}; shift 2 ;;
            --workers) WORKERS=${2:?--workers needs a number}; shift 2 ;;
            -h | --help) prepare_usage; exit 0 ;;
            *) die "unknown option: $1 (see --help)" ;;
        esac
    done
    local name kind
    for name in BPE_MERGES SPM_VOCAB WORKERS; do require_uint "$name"; done
    for kind in ${DATA_KINDS//,/ }; do
        case $kind in joined | words30k | words160k) ;; *) die "--data: unknown set '$kind' (joined, words30k, words160k)" ;; esac
    done
    RAW_DIR=${RAW_DIR:-$OUT/raw}
    TMP=$OUT/tmp
    mkdir -p "$RAW_DIR" "$TMP/extract" "$OUT/data-bin"
}

# download URL FILE: a file:// URL is copied (wget cannot read one), others go through curl, else wget.
download() {
    case $1 in
        file://*) cp -- "${1#file://}" "$2" ;;
        *) if command -v curl >/dev/null; then curl -fL --retry 3 -o "$2" "$1"
           elif command -v wget >/dev/null; then wget -q --tries 3 -O "$2" "$1"
           else die "neither curl nor wget is installed: cannot download $1 (or place the archive in $RAW_DIR)"; fi ;;
    esac
}

# fetch_archive NAME URL: make RAW_DIR/NAME exist. A download goes to NAME.part and is
# renamed only when complete, so a failed one leaves nothing under the final name.
fetch_archive() {
    local name=$1 url=$2 dest=$RAW_DIR/$1
    if [[ -f $dest ]]; then
        log "archive present: $dest"
        return
    fi
    ((OFFLINE == 0)) || die "missing archive: $dest (--offline: place $name, from $url, there)"
    [[ -z $MIRROR ]] || url=${MIRROR%/}/$name
    log "downloading $url"
    rm -f "$dest.part"
    download "$url" "$dest.part" || { rm -f "$dest.part"; die "download failed: $url (for $dest; nothing kept)"; }
    mv "$dest.part" "$dest"
}

# extract_archive NAME MD5 MEMBER...: verify RAW_DIR/NAME (md5 when known and enabled; tar
# reading it whole) and unpack the members into TMP/extract/NAME/ (skipped once done).
extract_archive() {
    local name=$1 md5=$2 archive=$RAW_DIR/$1 dir=$TMP/extract/$1
    shift 2
    if [[ -d $dir ]]; then
        log "skip extraction: $dir exists"
        return
    fi
    [[ -f $archive ]] || die "missing archive: $archive"
    if ((CHECK_MD5)) && [[ -n $md5 ]]; then
        local actual
        actual=$(md5sum "$archive") || die "cannot read $archive"
        [[ ${actual%% *} == "$md5" ]] || die "md5 mismatch: $archive has ${actual%% *}, expected $md5 (remove it and rerun to download it again, or pass --no-md5 for a repacked copy)"
    fi
    log "extracting $# files from $archive"
    rm -rf "$dir.part"
    mkdir -p "$dir.part"
    if ! tar -xf "$archive" -C "$dir.part" "$@"; then
        rm -rf "$dir.part"
        die "cannot extract $* from $archive: truncated or damaged archive, or a member missing (tar's message above; remove the archive and rerun to download it again)"
    fi
    mv "$dir.part" "$dir"
}

# read_text FILE: print a corpus file, decompressing .gz; fails loudly on a damaged file.
read_text() {
    case $1 in
        *.gz) gzip -dc "$1" ;;
        *) cat "$1" ;;
    esac
}

count_lines() {
    local n
    n=$(read_text "$1" | wc -l) || die "cannot read $1 (truncated or damaged?)"
    echo "$n"
}

# sgm_text FILE: the segments of a WMT SGML file, one per line.
sgm_text() {
    sed -n 's|^.*<seg[^>]*>[[:space:]]*\(.*\)</seg>.*$|\1|p' "$1"
}

# all_exist FILE...: true when every file exists (the step can be skipped).
all_exist() {
    local f
    for f in "$@"; do [[ -e $f ]] || return 1; done
}

prepare_download() {
    local entry name url md5 members
    for entry in "${ARCHIVES[@]}"; do
        read -r name url md5 <<<"$entry"
        fetch_archive "$name" "$url"
    done
    for entry in "${ARCHIVES[@]}"; do
        read -r name url md5 <<<"$entry"
        mapfile -t members < <(archive_members "$name")
        extract_archive "$name" "$md5" "${members[@]}"
    done
}

# The members of archive NAME that the corpus tables use.
archive_members() {
    local entry archive prefix suffix src ref
    for entry in "${TRAIN_CORPORA[@]}"; do
        read -r archive prefix suffix <<<"$entry"
        [[ $archive == "$1" ]] && printf '%s\n' "$prefix.$SRC${suffix:-}" "$prefix.$TGT${suffix:-}"
    done
    for entry in "${VALID_SETS[@]}" "$TEST_SET"; do
        read -r archive src ref <<<"$entry"
        [[ $archive == "$1" ]] && printf '%s\n' "$src" "$ref"
    done
    return 0
}

# Raw text: the training corpora are checked pair by pair (same line count) and read in
# place; the SGML dev/test sets become TMP/{valid,test}.raw.{src,tgt}.
prepare_raw_text() {
    local entry archive prefix suffix src ref n_src n_tgt i
    TRAIN_FILES_SRC=()
    TRAIN_FILES_TGT=()
    for entry in "${TRAIN_CORPORA[@]}"; do
        read -r archive prefix suffix <<<"$entry"
        src=$TMP/extract/$archive/$prefix.$SRC${suffix:-}
        ref=$TMP/extract/$archive/$prefix.$TGT${suffix:-}
        TRAIN_FILES_SRC+=("$src")
        TRAIN_FILES_TGT+=("$ref")
    done
    if ! all_exist "$TMP/train.tok.$SRC" "$TMP/train.tok.$TGT"; then
        for ((i = 0; i < ${#TRAIN_FILES_SRC[@]}; i++)); do
            n_src=$(count_lines "${TRAIN_FILES_SRC[i]}")
            n_tgt=$(count_lines "${TRAIN_FILES_TGT[i]}")
            ((n_src == n_tgt)) || die "corpus sides differ: ${TRAIN_FILES_SRC[i]} has $n_src lines, ${TRAIN_FILES_TGT[i]} has $n_tgt lines"
        done
    fi
    local split sets lang out
    for split in valid test; do
        if [[ $split == valid ]]; then sets=("${VALID_SETS[@]}"); else sets=("$TEST_SET"); fi
        for entry in "${sets[@]}"; do
            read -r archive src ref <<<"$entry"
            [[ -f $TMP/extract/$archive/$src ]] || die "missing $split set: $TMP/extract/$archive/$src"
            [[ -f $TMP/extract/$archive/$ref ]] || die "missing $split set: $TMP/extract/$archive/$ref"
        done
        for lang in "$SRC" "$TGT"; do
            out=$TMP/$split.raw.$lang
            [[ -e $out ]] && continue
            for entry in "${sets[@]}"; do
                read -r archive src ref <<<"$entry"
                if [[ $lang == "$SRC" ]]; then sgm_text "$TMP/extract/$archive/$src"; else sgm_text "$TMP/extract/$archive/$ref"; fi
            done >"$out.part"
            mv "$out.part" "$out"
        done
        n_src=$(count_lines "$TMP/$split.raw.$SRC")
        n_tgt=$(count_lines "$TMP/$split.raw.$TGT")
        ((n_src == n_tgt)) || die "$split set sides differ: $TMP/$split.raw.$SRC has $n_src lines, $TMP/$split.raw.$TGT has $n_tgt lines"
    done
}

# tokenize_language LANG WORKERS: normalise + tokenize the splits of LANG whose output is
# still missing (one process; the training corpora arrive concatenated on stdin).
tokenize_language() {
    local lang=$1 workers=$2 inputs=() outputs=() files=() split
    for split in train valid test; do
        [[ -e $TMP/$split.tok.$lang ]] && continue
        if [[ $split == train ]]; then inputs+=(-); else inputs+=("$TMP/$split.raw.$lang"); fi
        outputs+=("$TMP/$split.tok.$lang")
    done
    if ((${#outputs[@]} == 0)); then
        log "skip tokenization ($lang): outputs exist"
        return
    fi
    if [[ ${inputs[0]} == - ]]; then
        if [[ $lang == "$SRC" ]]; then files=("${TRAIN_FILES_SRC[@]}"); else files=("${TRAIN_FILES_TGT[@]}"); fi
    fi
    log "tokenizing ($lang): ${outputs[*]}"
    if ! for f in "${files[@]}"; do read_text "$f" || exit 1; done |
        fairseq-plugins-tokenize tokenize -l "$lang" --workers "$workers" -i "${inputs[@]}" -o "${outputs[@]}"; then
        rm -f "${outputs[@]}"
        die "tokenization ($lang) failed; outputs removed: ${outputs[*]}"
    fi
}

# Tokenize both languages side by side, then clean the training pairs.
prepare_tokenize() {
    local lang pids=() failed=0 workers=$(((WORKERS + 1) / 2))
    for lang in "$SRC" "$TGT"; do
        tokenize_language "$lang" "$workers" &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
    ((failed == 0)) || die "tokenization failed (see above); rerun to resume"
    if [[ ! -e $TMP/train.clean.$SRC || ! -e $TMP/train.clean.$TGT ]]; then
        log "cleaning the training pairs (1-250 tokens, ratio 1.5)"
        rm -f "$TMP/train.clean.$SRC" "$TMP/train.clean.$TGT"
        fairseq-plugins-tokenize clean --src "$TMP/train.tok.$SRC" --tgt "$TMP/train.tok.$TGT" \
            --src-out "$TMP/train.clean.$SRC.new" --tgt-out "$TMP/train.clean.$TGT.new" \
            --min-len 1 --max-len 250 --ratio 1.5
        mv "$TMP/train.clean.$SRC.new" "$TMP/train.clean.$SRC"
        mv "$TMP/train.clean.$TGT.new" "$TMP/train.clean.$TGT"
    else
        log "skip cleaning: $TMP/train.clean.{$SRC,$TGT} exist"
    fi
}

# Joint subword model learned on the cleaned training text of both languages, applied to
# every split: TMP/{train,valid,test}.{bpe|spm}.{src,tgt}.
prepare_subwords() {
    local kind=$1 model lang split
    if [[ $kind == bpe ]]; then
        model=$TMP/bpe.codes
        if [[ ! -e $model ]]; then
            log "learning $BPE_MERGES joint BPE merges"
            subword-nmt learn-joint-bpe-and-vocab --input "$TMP/train.clean.$SRC" "$TMP/train.clean.$TGT" \
                -s "$BPE_MERGES" -o "$model.part" --num-workers "$WORKERS" \
                --write-vocabulary "$TMP/bpe.vocab.$SRC" "$TMP/bpe.vocab.$TGT"
            mv "$model.part" "$model"
        fi
    else
        model=$TMP/spm.model
        if [[ ! -e $model ]]; then
            log "learning a joint sentencepiece model of $SPM_VOCAB pieces"
            fairseq-plugins-tokenize spm-train --input "$TMP/train.clean.$SRC" "$TMP/train.clean.$TGT" \
                --model-prefix "$TMP/spm.part" --vocab-size "$SPM_VOCAB" --workers "$WORKERS"
            mv "$TMP/spm.part.vocab" "$TMP/spm.vocab"
            mv "$TMP/spm.part.model" "$model"
        fi
    fi
    local inputs=() outputs=() i
    for lang in "$SRC" "$TGT"; do
        for split in train valid test; do
            [[ -e $TMP/$split.$kind.$lang ]] && continue
            if [[ $split == train ]]; then inputs+=("$TMP/train.clean.$lang"); else inputs+=("$TMP/$split.tok.$lang"); fi
            outputs+=("$TMP/$split.$kind.$lang")
        done
    done
    ((${#outputs[@]})) || { log "skip applying $kind: outputs exist"; return 0; }
    log "applying $kind to ${#outputs[@]} files"
    if [[ $kind == bpe ]]; then
        for ((i = 0; i < ${#outputs[@]}; i++)); do
            subword-nmt apply-bpe -c "$model" --num-workers "$WORKERS" -i "${inputs[i]}" -o "${outputs[i]}.part"
            mv "${outputs[i]}.part" "${outputs[i]}"
        done
    else
        fairseq-plugins-tokenize spm-encode --model "$model" -i "${inputs[@]}" -o "${outputs[@]}"
    fi
}

# binarize KIND [fairseq-preprocess options...]: OUT/data-bin/KIND from the bpe/spm
# splits (KIND bpe, spm) or the word-level ones (other KINDs), with the subword model and
# the newstest2014 references that evaluate.sh needs next to the binarized data.
binarize() {
    local kind=$1 dest=$OUT/data-bin/$1 train valid test extra=()
    shift
    if [[ -d $dest ]]; then
        log "skip binarization: $dest exists"
        return
    fi
    case $kind in
        bpe) train=$TMP/train.bpe valid=$TMP/valid.bpe test=$TMP/test.bpe extra=("$TMP/bpe.codes") ;;
        spm) train=$TMP/train.spm valid=$TMP/valid.spm test=$TMP/test.spm extra=("$TMP/spm.model") ;;
        *) train=$TMP/train.clean valid=$TMP/valid.tok test=$TMP/test.tok ;;
    esac
    log "binarizing into $dest"
    rm -rf "$dest.part"
    fairseq-preprocess --source-lang "$SRC" --target-lang "$TGT" \
        --trainpref "$train" --validpref "$valid" --testpref "$test" \
        --destdir "$dest.part" --workers "$WORKERS" "$@" >"$TMP/preprocess.$kind.log" 2>&1 ||
        { rm -rf "$dest.part"; die "fairseq-preprocess failed for $dest (log: $TMP/preprocess.$kind.log)"; }
    ((${#extra[@]} == 0)) || cp "${extra[@]}" "$dest.part/"
    cp "$TMP/test.raw.$SRC" "$dest.part/newstest2014.raw.$SRC"
    cp "$TMP/test.raw.$TGT" "$dest.part/newstest2014.raw.$TGT"
    cp "$TMP/test.tok.$SRC" "$dest.part/newstest2014.tok.$SRC"
    cp "$TMP/test.tok.$TGT" "$dest.part/newstest2014.tok.$TGT"
    mv "$dest.part" "$dest"
}

prepare_run() {
    prepare_parse_args "$@"
    local tool
    for tool in fairseq-plugins-tokenize subword-nmt fairseq-preprocess; do
        command -v "$tool" >/dev/null || die "command not found: $tool (pip install the fairseq-plugins package)"
    done
    log "WMT'14 $SRC-$TGT into $OUT (archives in $RAW_DIR)"
    prepare_download
    prepare_raw_text
    prepare_tokenize
    local kind sub
    for kind in ${DATA_KINDS//,/ }; do
        case $kind in
            joined)
                sub=$([[ $USE_SPM == 1 ]] && echo spm || echo bpe)
                [[ -d $OUT/data-bin/$sub ]] || prepare_subwords "$sub"
                binarize "$sub" --joined-dictionary
                ;;
            words30k) binarize words30k --nwordssrc 30000 --nwordstgt 30000 ;;
            words160k) binarize words160k --nwordssrc 160000 --nwordstgt 80000 ;;
        esac
    done
    log "done: $OUT/data-bin"
}
