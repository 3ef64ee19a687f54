# shellcheck shell=bash
# Helpers shared by every WMT'14 example script (sourced; the caller sets -euo pipefail).
#
# Environment read here (train and evaluate):
#   NUM_GPUS    GPUs taking part in total over all nodes (default: CUDA_VISIBLE_DEVICES,
#               else `nvidia-smi -L`, else 0 = CPU)
#   PRECISION   auto (fp16 on GPUs, fp32 on CPU) | fp16 | amp | fp32
#   USER_DIR    the fairseq_plugins package directory (default: found with Python)
#   DRY_RUN=1   print the commands instead of running them

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '%s: error: %s\n' "${0##*/}" "$*" >&2; exit 1; }

is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }

# require_uint NAME: the variable NAME holds a whole number > 0.
require_uint() {
    local value=${!1}
    if ! is_uint "$value" || ((value == 0)); then die "$1 must be a positive whole number, got '$value'"; fi
}

# Sets NUM_GPUS from the environment or the machine.
detect_gpus() {
    if [[ -n ${NUM_GPUS:-} ]]; then
        is_uint "$NUM_GPUS" || die "NUM_GPUS must be a whole number, got '$NUM_GPUS'"
    elif [[ -n ${CUDA_VISIBLE_DEVICES+set} ]]; then
        local devices
        IFS=, read -r -a devices <<<"$CUDA_VISIBLE_DEVICES"
        NUM_GPUS=${#devices[@]}
    elif command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
        NUM_GPUS=$(nvidia-smi -L | grep -c '^GPU ')
    else
        NUM_GPUS=0
    fi
}

# shellcheck disable=SC2034  # DEVICE_FLAGS is read by the sourcing scripts
# Sets DEVICE_FLAGS (device and precision flags of fairseq-train and fairseq-generate).
device_flags() {
    local precision=${PRECISION:-auto}
    if ((NUM_GPUS == 0)); then
        case $precision in
            auto | fp32) DEVICE_FLAGS=(--cpu) ;;
            *) die "PRECISION=$precision needs a GPU, but none was found (NUM_GPUS=0)" ;;
        esac
        return
    fi
    case $precision in
        auto | fp16) DEVICE_FLAGS=(--fp16) ;;
        amp) DEVICE_FLAGS=(--amp) ;;
        fp32) DEVICE_FLAGS=() ;;
        bf16) die "PRECISION=bf16 is not available: fairseq's --bf16 implies --tpu and fails on GPUs (use fp16 or amp)" ;;
        *) die "PRECISION must be auto, fp16, amp or fp32, got '$precision'" ;;
    esac
}

# Sets USER_DIR to the installed fairseq_plugins package (found without importing it).
find_user_dir() {
    if [[ -n ${USER_DIR:-} ]]; then
        [[ -d $USER_DIR ]] || die "USER_DIR is not a directory: $USER_DIR"
        return
    fi
    local python train
    train=$(command -v fairseq-train) || die "fairseq-train not found: activate the environment where fairseq-plugins is installed"
    python=$(dirname "$train")/python
    [[ -x $python ]] || python=python3
    USER_DIR=$("$python" -c 'import importlib.util as u; s = u.find_spec("fairseq_plugins"); print(s.submodule_search_locations[0])' 2>/dev/null) ||
        die "the fairseq_plugins package is not importable by $python: pip install it, or set USER_DIR"
}

# run_or_print CMD...: run the command, or with DRY_RUN=1 print it (shell-quoted, one line).
run_or_print() {
    if [[ ${DRY_RUN:-0} == 1 ]]; then
        printf '%q ' "$@"
        printf '\n'
    else
        "$@"
    fi
}
