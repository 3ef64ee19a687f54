#!/usr/bin/env bash
# fairseq's own unit tests without and with the suite (not part of CI: it needs a fairseq checkout).
#
#   bash scripts/fairseq_own_tests.sh FAIRSEQ_REPO_DIR [pytest arguments]
#
# Copies FAIRSEQ_REPO_DIR's tests/ and scripts/ (tests/test_average_checkpoints.py imports
# scripts.average_checkpoints) into two temporary folders and runs the files of TESTS below in
# each with the installed fairseq: once plain, once with a conftest.py holding
# `import fairseq_plugins`, which installs the suite's patches as `--user-dir fairseq_plugins`
# does. Prints, per test file, passed/failed/skipped without and with the suite, then every test
# that passes without the suite and fails with it (a regression, with its error) and the reverse.
# The suite imported is the one Python finds: set PYTHONPATH to a checkout to test that one.
# Settings: PYTHON (default: python on PATH), KEEP=1 keeps the temporary folders and JUnit reports,
# PLAIN_REPORT=FILE.xml reuses a kept plain.xml (the side without the suite does not depend on it).
# Exit status: 1 when there is a regression, else 0.
set -euo pipefail
[ $# -ge 1 ] && [ -d "$1/tests" ] || { echo "usage: $0 FAIRSEQ_REPO_DIR [pytest arguments] (a directory holding fairseq's tests/)" >&2; exit 2; }
REPO_DIR=$(realpath "$1"); shift
PYTHON=${PYTHON:-python}
# test_binaries.py: only its translation tests (the TestTranslation class).
TESTS=(test_sequence_generator test_sequence_scorer test_iterators test_checkpoint_utils test_train
       test_reproducibility test_inference_dropout test_label_smoothing test_export test_lstm_jitable
       test_constraints test_average_checkpoints test_valid_subset_checks test_ema test_binaries)
SELECT=()
for name in "${TESTS[@]}"; do
    [ -f "$REPO_DIR/tests/$name.py" ] || { echo "error: $REPO_DIR/tests/$name.py: no such test file" >&2; exit 2; }
    if [ "$name" = test_binaries ]; then SELECT+=("tests/$name.py::TestTranslation"); else SELECT+=("tests/$name.py"); fi
done

WORK=$(mktemp -d -t fairseq-own-tests.XXXXXX)
if [ "${KEEP:-0}" = 1 ]; then echo "temporary folders kept under $WORK"; else trap 'rm -rf "$WORK"' EXIT; fi
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
unset TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD  # neither side may lean on it

for side in plain suite; do
    [ "$side" = plain ] && [ -n "${PLAIN_REPORT:-}" ] && continue
    mkdir -p "$WORK/$side"
    cp -r "$REPO_DIR/tests" "$WORK/$side/tests"
    [ -d "$REPO_DIR/scripts" ] && cp -r "$REPO_DIR/scripts" "$WORK/$side/scripts"
    if [ "$side" = suite ]; then
        echo "import fairseq_plugins  # noqa: F401  (as --user-dir fairseq_plugins does)" > "$WORK/$side/conftest.py"
    fi
    echo "== fairseq's tests, $side: ${SELECT[*]}" >&2
    (cd "$WORK/$side" && nice "$PYTHON" -m pytest -q -p no:cacheprovider --rootdir . --junitxml "$WORK/$side.xml" \
        "${SELECT[@]}" "$@" > "$WORK/$side.log" 2>&1) || true
    tail -n 1 "$WORK/$side.log" >&2
done

if [ -n "${PLAIN_REPORT:-}" ]; then cp "$PLAIN_REPORT" "$WORK/plain.xml"; fi
"$PYTHON" - "$WORK/plain.xml" "$WORK/suite.xml" "${TESTS[@]}" <<'EOF'
import re
import sys
import xml.etree.ElementTree as ET

plain_xml, suite_xml, *files = sys.argv[1:]


def outcomes(path):
    """{test id: (outcome, first line of its error)} from a JUnit report."""
    found = {}
    for case in ET.parse(path).iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = "skipped" if child.tag == "skipped" else "failed"
                text = re.sub(r"#x1B\[[0-9;]*m", "", child.get("message") or child.text or "")  # pytest's escaped colours
                lines = [line.strip() for line in text.splitlines() if line.strip()]
                message = " ".join(lines[:2])[:300]  # "RuntimeError:" alone says little
        found[name] = (outcome, message)
    return found


plain, suite = outcomes(plain_xml), outcomes(suite_xml)


def counts(results, file):
    picked = [o for name, (o, _) in results.items() if name.split("::")[0].split(".")[:2] == ["tests", file]]
    return "/".join(str(picked.count(o)) for o in ("passed", "failed", "skipped"))


print("\n| test file | without the suite (passed/failed/skipped) | with the suite |")
print("|---|---:|---:|")
for file in files:
    label = f"{file} (TestTranslation)" if file == "test_binaries" else file
    print(f"| {label} | {counts(plain, file)} | {counts(suite, file)} |")
total = {side: "/".join(str([o for o, _ in r.values()].count(o)) for o in ("passed", "failed", "skipped"))
         for side, r in (("plain", plain), ("suite", suite))}
print(f"| **all** | {total['plain']} | {total['suite']} |")

regressions = sorted(n for n in plain if plain[n][0] == "passed" and suite.get(n, ("missing",))[0] != "passed")
fixed = sorted(n for n in suite if suite[n][0] == "passed" and plain.get(n, ("missing",))[0] != "passed")
print(f"\nregressions (pass without the suite, not with it): {len(regressions)}")
for name in regressions:
    outcome, message = suite.get(name, ("missing", ""))
    print(f"  {name}: {outcome}: {message}")
print(f"\nfail without the suite, pass with it: {len(fixed)}")
for name in fixed:
    print(f"  {name} (without: {plain.get(name, ('missing', ''))[0]}: {plain.get(name, ('', ''))[1][:160]})")
sys.exit(1 if regressions else 0)
EOF
