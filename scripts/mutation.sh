#!/usr/bin/env bash
# Mutation testing (cosmic-ray) of the modules where a silent bug costs most, each against the
# tests that cover it: a small change is put into the code, one at a time, and the tests must fail.
# Not part of CI: hours on 2 cores (docs/TESTING.md has the last result, reports/mutation/sessions.md every
# survivor's fate).
#
#   bash scripts/mutation.sh                      # all twenty-seven modules below
#   bash scripts/mutation.sh patches/resume.py lr_schedulers/inverse_sqrt_warmup.py
#   MUTATION_LINES="63-82 156-173" bash scripts/mutation.sh fairseq_plugins_onnx.py  # those lines only
#
# It mutates a throw-away git worktree of HEAD (with MUTATION_UNCOMMITTED=1, plus this checkout's
# uncommitted changes to tracked files; untracked files are never carried), never this checkout,
# so other runs here are unaffected and nothing is left mutated. The tests run there with
# PYTHONPATH at that worktree: pytest, and every fairseq-train/-generate they start (--user-dir
# is taken from the imported fairseq_plugins), import the mutated file; checked before the first
# mutant. A mutant gets 5x the unmutated tests' time + 120 s. Results: work/mutation/<module>.
# {sqlite,txt} (MUTATION_OUT), with each survivor's diff; MUTATION_RESUME=1 goes on with the
# mutants an interrupted run left; MUTATION_RECHECK=1 puts each survivor and timeout of the last
# run back in, one at a time, and says whether today's tests kill it. The tool has its own venv (MUTATION_VENV, default
# .venv-mutation); the suite's .venv (scripts/setup_env.sh) runs the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY=$REPO/.venv/bin/python
TOOL_VENV=${MUTATION_VENV:-$REPO/.venv-mutation}
OUT=${MUTATION_OUT:-$REPO/work/mutation}
COSMIC_RAY=cosmic-ray==8.7.0

# module (under fairseq_plugins/, or the top-level runtime) -> the tests that cover it, fastest first
# (pytest -x stops at the first failure, so a killed mutant costs the time to its first failing test)
tests_for() {
    case "$1" in
        criterions/label_smoothed_xent.py) echo "tests/unit/criterions/test_label_smoothed_xent.py \
tests/unit/criterions/test_bf16.py -m 'not slow'" ;;
        lr_schedulers/inverse_sqrt_warmup.py) echo "tests/unit/lr_schedulers/test_inverse_sqrt_warmup.py" ;;
        patches/resume.py) echo "tests/unit/patches/test_resume.py \
tests/integration/test_finished_run.py tests/integration/test_patience_restart.py tests/integration/test_elastic_resume.py" ;;
        patches/numerical.py) echo "tests/unit/patches/test_numerical.py tests/unit/patches/test_divergence.py" ;;
        patches/preemption.py) echo "tests/unit/patches/test_preemption.py tests/integration/test_clean_exit.py \
tests/integration/test_cluster.py -k 'preempt or sigterm or signal or clean or abort'" ;;
        modules/beam_cache.py) echo "tests/unit/modules/test_beam_cache.py tests/unit/export/test_torch_export.py" ;;
        fairseq_plugins_onnx.py) echo "tests/integration/export/test_export_onnx.py -k 'not page'" ;;  # the page runs its own JS
        patches/checkpoint_io.py) echo "tests/unit/patches/test_checkpoint_io.py tests/unit/test_atomic_write.py \
tests/unit/patches/test_compat.py tests/unit/patches/test_fairseq_regressions.py tests/unit/test_checkpoints.py" ;;
        modules/decoding_linear.py) echo "tests/unit/modules/test_decoding_linear.py tests/unit/models/test_compiled_decoding.py -k 'not fairseq_generate'" ;;
        patches/generation.py) echo "tests/unit/patches/test_generation.py tests/unit/models/test_compiled_decoding.py -k 'not fairseq_generate'" ;;
        modules/multihead_attention.py) echo "tests/unit/models/test_transformer.py tests/unit/modules/test_beam_cache.py tests/unit/export/test_torch_export.py" ;;
        modules/transformer_layer.py|modules/positional_embedding.py) echo "tests/unit/models/test_transformer.py \
tests/unit/models/test_transformer_defaults.py tests/unit/modules/test_beam_cache.py tests/unit/export/test_torch_export.py" ;;
        checkpoints.py) echo "tests/unit/test_checkpoints.py tests/unit/test_atomic_write.py tests/unit/patches/test_checkpoint_io.py \
tests/integration/test_quickstart.py::test_averaging_window_keeps_to_the_end_of_the_training_done" ;;
        serve/batching.py) echo "tests/unit/serve/test_batching.py" ;;
        modules/additive_attention.py) echo "tests/unit/models/test_rnn_models.py tests/unit/models/test_compiled_decoding.py -k 'not fairseq_generate'" ;;
        modules/conditional_gru.py|modules/maxout.py) echo "tests/unit/models/test_rnn_models.py" ;;
        modules/gru.py|modules/lstm.py) echo "tests/unit/models/test_rnn_models.py tests/unit/export/test_torch_export.py" ;;  # scan, jit.script
        modules/recurrence.py) echo "tests/unit/models/test_rnn_models.py tests/unit/export/test_torch_export.py" ;;
        models/rnnsearch.py|models/rnnencdec.py|models/seq2seq_lstm.py) echo "tests/unit/models/test_rnn_models.py tests/unit/modules/test_beam_cache.py \
tests/unit/export/test_torch_export.py tests/unit/models/test_training_oracle.py -k 'not vaswani and not transformer'" ;;
        models/transformer.py) echo "tests/unit/models/test_transformer_defaults.py tests/unit/models/test_transformer.py tests/unit/modules/test_beam_cache.py \
tests/unit/export/test_torch_export.py tests/unit/models/test_training_oracle.py -k 'not rnn and not seq2seq and not lstm'" ;;  # not the CLI's 85 s
        models/transformer_convert.py) echo "tests/unit/models/test_transformer.py tests/integration/test_transformer_cli.py -k 'convert'" ;;
        lr_schedulers/sutskever_halving.py) echo "tests/unit/models/test_rnn_models.py tests/unit/test_registry.py -k 'halving or registered'" ;;
        *) return 1 ;;
    esac
}
ALL=(criterions/label_smoothed_xent.py lr_schedulers/inverse_sqrt_warmup.py patches/resume.py
     modules/beam_cache.py patches/numerical.py
     patches/preemption.py fairseq_plugins_onnx.py patches/checkpoint_io.py modules/decoding_linear.py
     patches/generation.py modules/multihead_attention.py modules/transformer_layer.py
     modules/positional_embedding.py checkpoints.py serve/batching.py
     modules/additive_attention.py modules/gru.py modules/conditional_gru.py
     modules/maxout.py modules/lstm.py modules/recurrence.py models/rnnsearch.py models/rnnencdec.py
     models/seq2seq_lstm.py models/transformer.py models/transformer_convert.py lr_schedulers/sutskever_halving.py)
modules=("$@")
[ ${#modules[@]} -gt 0 ] || modules=("${ALL[@]}")
for module in "${modules[@]}"; do
    tests_for "$module" >/dev/null || {
        echo "error: $module: not a module this script tests (one of: ${ALL[*]})" >&2; exit 2; }
done
[ -x "$PY" ] || { echo "error: $PY missing: run bash scripts/setup_env.sh first" >&2; exit 2; }

if ! "$TOOL_VENV/bin/python" -c "import cosmic_ray" 2>/dev/null; then
    echo "== installing $COSMIC_RAY into $TOOL_VENV"
    python3 -m venv "$TOOL_VENV"
    "$TOOL_VENV/bin/pip" install --quiet --disable-pip-version-check "$COSMIC_RAY"
fi

RUN=$(mktemp -d "${TMPDIR:-/tmp}/fairseq-plugins-mutation.XXXXXX")  # this run's own: worktree, configs, runners
WT=$RUN/worktree
cleanup() { git -C "$REPO" worktree remove --force "$WT" 2>/dev/null; rm -rf "$RUN"; }
trap cleanup EXIT
git worktree add --quiet --detach "$WT" HEAD
if [ "${MUTATION_UNCOMMITTED:-0}" = 1 ]; then git diff HEAD --binary | git -C "$WT" apply --whitespace=nowarn; fi
mkdir -p "$OUT"
export PYTHONPATH=$WT  # the worktree's fairseq_plugins and fairseq_plugins_onnx, in every subprocess too
where=$(cd "$WT" && "$PY" -c 'import fairseq_plugins, fairseq_plugins_onnx
print(fairseq_plugins.__file__, fairseq_plugins_onnx.__file__)')
case "$where" in
    "$WT/fairseq_plugins/__init__.py $WT/fairseq_plugins_onnx.py") ;;
    *) echo "error: the worktree's tests would import $where, not $WT's files" >&2; exit 1 ;;
esac
echo "== mutating a worktree of $(git rev-parse --short HEAD)$([ "${MUTATION_UNCOMMITTED:-0}" = 1 ] && echo ' and the uncommitted changes') at $WT; results in $OUT"

for module in "${modules[@]}"; do
    path=fairseq_plugins/$module
    [ "$module" = fairseq_plugins_onnx.py ] && path=$module
    name=${module%.py}; name=${name//\//.}
    tests=$(tests_for "$module")  # shell words, pasted into the runner as they are
    runner=$RUN/$name.run-tests.sh
    # The runtime's fixtures (trained models, exported folders, fairseq-generate's output) never run
    # it (the exporter only copies the file): built once by the unmutated tests, reused by its mutants.
    shared=""
    [ "$module" = fairseq_plugins_onnx.py ] && shared="FAIRSEQ_PLUGINS_TEST_SHARED=$RUN/shared"
    mkdir -p "$RUN/shared"
    printf '#!/usr/bin/env bash\ncd %q && %s exec nice -n 10 %q -m pytest -x -q -p no:cacheprovider -n 0 %s\n' \
        "$WT" "$shared" "$PY" "$tests" > "$runner"
    echo "== $module: unmutated tests ($tests)"
    start=$(date +%s)
    bash "$runner" > "$OUT/$name.baseline.log" 2>&1 || {
        echo "error: $module: the tests fail without a mutation (see $OUT/$name.baseline.log)" >&2; exit 1; }
    if [ -n "$shared" ]; then  # that run built the fixtures; a mutant's run reuses them: time one such run
        start=$(date +%s)
        bash "$runner" >> "$OUT/$name.baseline.log" 2>&1 || {
            echo "error: $module: the tests fail on built fixtures (see $OUT/$name.baseline.log)" >&2; exit 1; }
    fi
    timeout=$(( 5 * ($(date +%s) - start) + 120 ))  # generous: a loaded machine slows a mutant down too
    config=$RUN/$name.toml
    # Left out: replacements that are type errors on this code's numbers and booleans (an arithmetic
    # operator to a shift or bitwise one, a comparison to `is`, `~`): they cost a run and show nothing.
    cat > "$config" <<EOF
[cosmic-ray]
module-path = "$path"
timeout = $timeout.0
excluded-modules = []
test-command = "bash $runner"
[cosmic-ray.distributor]
name = "local"
[cosmic-ray.filters.operators-filter]
exclude-operators = ["core/ReplaceBinaryOperator_.*_(BitOr|BitAnd|BitXor|LShift|RShift)$",
                     "core/ReplaceComparisonOperator_(Eq|NotEq|Lt|LtE|Gt|GtE)_(Is|IsNot)$",
                     "core/ReplaceUnaryOperator_.*_Invert$"]
EOF
    if [ -n "${MUTATION_LINES:-}" ]; then  # e.g. a change's new lines: cosmic-ray skips the others
        read -r -a spans <<< "$MUTATION_LINES"
        ranges=$(printf '"%s", ' "${spans[@]}")
        printf '[cosmic-ray.filters.line-filter]\nlines = { "%s" = [%s] }\n' "$path" "${ranges%, }" >> "$config"
    fi
    unmutated=$(sha1sum < "$WT/$path")
    session=$OUT/$name.sqlite
    made_from=$OUT/$name.module.sha1  # the file a session's mutants were made from: they apply by occurrence
    if [ "${MUTATION_RECHECK:-0}" = 1 ] || { [ "${MUTATION_RESUME:-0}" = 1 ] && [ -f "$session" ]; }; then
        if [ ! -f "$made_from" ]; then
            echo "warning: $module: no record of the file its last run mutated; taken as unchanged" >&2
        elif [ "$(cat "$made_from")" != "$unmutated" ]; then
            echo "error: $module changed since its last run, whose mutants apply by occurrence: run it again" >&2
            exit 2
        fi
    fi
    if [ "${MUTATION_RECHECK:-0}" = 1 ]; then  # the last run's survivors and timeouts, against today's tests
        "$TOOL_VENV/bin/cosmic-ray" dump "$session" | "$PY" "$REPO/scripts/mutation_summary.py" --unkilled |
        while read -r file operator occurrence line; do  # the module unchanged since (checked above)
            cp "$WT/$file" "$RUN/unmutated.py"
            status=0
            if (cd "$WT" && "$TOOL_VENV/bin/cosmic-ray" apply "$file" "$operator" "$occurrence" >/dev/null 2>&1) &&
                ! cmp -s "$WT/$file" "$RUN/unmutated.py"; then
                timeout "$timeout" bash "$runner" >/dev/null 2>&1 </dev/null || status=$?
                case $status in 0) verdict=survives ;; 124) verdict=timeout ;; *) verdict=killed ;; esac
            else
                verdict="no longer applies (the module changed: run it again)"
            fi
            cp "$RUN/unmutated.py" "$WT/$file"
            echo "$module: $operator #$occurrence (line $line): $verdict"
        done
        continue
    fi
    if [ "${MUTATION_RESUME:-0}" != 1 ] || [ ! -f "$session" ]; then  # MUTATION_RESUME=1: the mutants not run yet
        rm -f "$session"
        echo "$unmutated" > "$made_from"
        (cd "$WT" && "$TOOL_VENV/bin/cosmic-ray" init "$config" "$session" &&
            "$TOOL_VENV/bin/cr-filter-operators" "$session" "$config" &&
            if [ -n "${MUTATION_LINES:-}" ]; then "$TOOL_VENV/bin/cr-filter-lines" --config "$config" "$session"; fi)
    fi
    (cd "$WT" && "$TOOL_VENV/bin/cosmic-ray" exec "$config" "$session")
    "$TOOL_VENV/bin/cosmic-ray" dump "$session" | "$PY" "$REPO/scripts/mutation_summary.py" "$module" | tee "$OUT/$name.txt"
    [ "$(sha1sum < "$WT/$path")" = "$unmutated" ] || { echo "error: $path was left mutated in the worktree" >&2; exit 1; }
done
