#!/usr/bin/env bash
# Data-parallel fairseq-train on one CPU machine: N worker processes on loopback, gloo.
#
#   scripts/train_cpu_distributed.sh N DATA [fairseq-train flags...]
#
# Environment: PORT (rendezvous port, default 29500 + a number from this shell's pid),
# TIMEOUT (seconds, default 0 = none: if set, all workers are stopped after it),
# OMP_NUM_THREADS (threads per worker, default: CPU cores / N, at least 1 — more threads
# than cores makes gloo's all-reduce wait on busy cores, 50x slower),
# FAIRSEQ_TRAIN (the command, default fairseq-train), LOG_DIR (default: none; with it,
# worker R > 0 writes LOG_DIR/rank-R.log instead of the terminal).
#
# Each worker is started with
#   --cpu --distributed-backend gloo --distributed-world-size N
#   --distributed-init-method tcp://127.0.0.1:PORT --distributed-no-spawn
#   --distributed-rank R --ddp-backend legacy_ddp
# because on CPU fairseq-fixed cannot start them itself: it spawns one process per CUDA
# device (0 here), torchrun hits a division by the CUDA device count, and pytorch_ddp
# rejects CPU modules (see docs/SCALE.md). Each worker reads 1/N of every epoch's batches
# (--max-tokens is per worker); gradients are summed over workers before each update, so N
# workers x --max-tokens T make the same updates as 1 process x --max-tokens T
# --update-freq N. If a worker fails, the others are stopped (they would otherwise wait
# forever in the next all-reduce) and the script exits with the first failure's status.
set -u

usage() { echo "usage: $0 N DATA [fairseq-train flags...]" >&2; exit 2; }
[ $# -ge 2 ] || usage
N=$1; shift
case "$N" in ''|*[!0-9]*|0*) echo "error: N must be a positive integer, got '$N'" >&2; exit 2;; esac
case "${TIMEOUT:-0}" in *[!0-9]*) echo "error: TIMEOUT must be whole seconds, got '$TIMEOUT'" >&2; exit 2;; esac
PORT=${PORT:-$((29500 + $$ % 1000))}
TIMEOUT=${TIMEOUT:-0}
FAIRSEQ_TRAIN=${FAIRSEQ_TRAIN:-fairseq-train}
threads=$(( $(nproc) / N ))
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( threads > 0 ? threads : 1 ))}
LOG_DIR=${LOG_DIR:-}
[ -z "$LOG_DIR" ] || mkdir -p "$LOG_DIR"

pids=()
stop_all() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; }
trap 'stop_all; exit 130' INT TERM

for ((rank = 0; rank < N; rank++)); do
    cmd=("$FAIRSEQ_TRAIN" "$@" --cpu --distributed-backend gloo --distributed-world-size "$N"
         --distributed-init-method "tcp://127.0.0.1:$PORT" --distributed-no-spawn
         --distributed-rank "$rank" --ddp-backend legacy_ddp)
    if [ -n "$LOG_DIR" ] && [ "$rank" -gt 0 ]; then
        "${cmd[@]}" > "$LOG_DIR/rank-$rank.log" 2>&1 &
    else
        "${cmd[@]}" &
    fi
    pids+=($!)
done

if [ "$TIMEOUT" -gt 0 ]; then
    (
        trap 'kill "$nap" 2>/dev/null; exit 0' TERM
        sleep "$TIMEOUT" & nap=$!
        wait "$nap"
        echo "error: workers still running after TIMEOUT=${TIMEOUT}s (a worker that never reached" \
             "tcp://127.0.0.1:$PORT, or one stuck in a collective); stopping them" >&2
        kill "${pids[@]}" 2>/dev/null
    ) &
    watchdog=$!
fi

status=0
remaining=$N
while [ "$remaining" -gt 0 ]; do
    wait -n "${pids[@]}"
    rc=$?
    remaining=$((remaining - 1))
    if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then
        status=$rc
        echo "error: a worker exited with status $rc; stopping the others" >&2
        stop_all
    fi
done
[ -z "${watchdog:-}" ] || kill "$watchdog" 2>/dev/null
exit "$status"
