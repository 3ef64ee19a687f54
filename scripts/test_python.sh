#!/usr/bin/env bash
# A slice of the test suite under a chosen Python, in its own virtualenv (.venv-pyVERSION),
# made by scripts/setup_env.sh. Not part of CI: the first run downloads several GB (the
# registry's torch is the CUDA build; it runs on CPU).
#
#   bash scripts/test_python.sh 3.12                 # the default slice below
#   bash scripts/test_python.sh 3.10 -x -k hub        # extra arguments go to pytest
#   bash scripts/test_python.sh 3.13 tests/unit/criterions/test_bf16.py   # a test path replaces the slice
#
# setup.py picks the fairseq distribution: official fairseq==0.12.2 below Python 3.11,
# fairseq-fixed from 3.11. Environment: TORCH_SPEC (default torch==2.13.0; on 3.10
# "torch==2.7.0 torchaudio==2.7.0", because fairseq 0.12.2 needs a torchaudio built for the same
# torch and none exists for 2.13), PYTHON (default python$VERSION on PATH, else pyenv's newest
# $VERSION.x), VENV (default .venv-py$VERSION).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${1:?usage: bash scripts/test_python.sh VERSION [pytest args], e.g. 3.12}
shift
case "$VERSION" in
    3.10) default_torch="torch==2.7.0 torchaudio==2.7.0" ;;
    3.*) default_torch="torch==2.13.0" ;;
    *) echo "error: VERSION=$VERSION: give a Python version such as 3.12" >&2; exit 2 ;;
esac
if [ -z "${PYTHON:-}" ]; then
    root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
    for candidate in $(command -v "python$VERSION") $(printf '%s\n' "$root"/versions/"$VERSION".*/bin/python"$VERSION" | sort -rV); do
        if "$candidate" -c "import sys; assert '%d.%d' % sys.version_info[:2] == '$VERSION'" 2>/dev/null; then
            PYTHON=$candidate; break
        fi
    done
    [ -n "${PYTHON:-}" ] || { echo "error: no Python $VERSION found on PATH or in $root/versions; set PYTHON=/path/to/python$VERSION" >&2; exit 2; }
fi
export PYTHON VENV=${VENV:-.venv-py$VERSION} TORCH_SPEC=${TORCH_SPEC:-$default_torch}
bash scripts/setup_env.sh

# The default slice: every model family's oracles and command-line runs, the registries, the
# fairseq-facing patches and the deployment path; not the long drills and benchmarks.
tests=(tests/unit/test_registry.py tests/integration/test_registry_cli.py
       tests/unit/criterions/test_label_smoothed_xent.py tests/unit/lr_schedulers/test_inverse_sqrt_warmup.py
       tests/unit/patches/test_compat.py
       tests/unit/models/test_transformer.py tests/unit/models/test_rnn_models.py tests/integration/test_end_to_end.py tests/integration/test_rnn_cli.py
       tests/integration/test_transformer_cli.py tests/integration/test_hub.py tests/integration/test_user_dir.py
       tests/integration/export/test_export_ctranslate2.py tests/integration/test_generation_patches.py)
# fairseq 0.12.2 (Python 3.10) is where patches such as encoder_fast_path act: their tests too
[ "$VERSION" != 3.10 ] || tests+=(tests/unit/patches/test_{mechanism,checkpoint_io,data,models,launch,numerical,resume,preemption,generation}.py)
for arg in "$@"; do
    case "$arg" in tests/*) tests=() ;; esac  # the caller chose the files
done
export PATH="$PWD/$VENV/bin:$PATH"  # the tests call fairseq-* from the venv
py=$VENV/bin/python
echo "== $("$py" -V), $("$py" -c 'from importlib.metadata import version as v, PackageNotFoundError as E
def find(*names):
    for n in names:
        try: return f"{n} {v(n)}"
        except E: pass
print(find("fairseq-fixed", "fairseq") + ", torch " + v("torch"))'), $(date -u +%F)"
exec "$py" -m pytest -q -p no:cacheprovider -rfE "${tests[@]}" "$@"
