#!/usr/bin/env bash
# Training parity on real language (docs/RESULTS.md#training-parity): the gettext catalogs'
# English→LANG pair (Moses + joint BPE 8k), then examples/parity/run.py: the suite's Transformer
# and RNNsearch against fairseq's transformer and lstm, same flags and budget, several seeds.
#   bash examples/parity/run.sh [WORK] [run.py flags...]
#   bash examples/parity/run.sh work/parity --size base --device cuda --jobs 1 --updates 4000   # a GPU
# LANG=fr by default (LANG_PAIR=de for German). Steps whose output exists are skipped.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=${1:-work/parity}
shift || true
lang=${LANG_PAIR:-fr}
mkdir -p "$work"
if [ ! -f "$work/catalog-$lang/bpe/test.$lang" ]; then
    fairseq-plugins-catalog-corpus --lang "$lang" --out "$work/catalog-$lang"
fi
if [ ! -f "$work/bin-$lang/test.en-$lang.$lang.idx" ]; then
    fairseq-preprocess --source-lang en --target-lang "$lang" --trainpref "$work/catalog-$lang/bpe/train" \
        --validpref "$work/catalog-$lang/bpe/valid" --testpref "$work/catalog-$lang/bpe/test" \
        --joined-dictionary --destdir "$work/bin-$lang" --workers 2
fi
python "$here/run.py" --data "$work/bin-$lang" --source-lang en --target-lang "$lang" --work "$work/runs" "$@"
