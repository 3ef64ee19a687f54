#!/usr/bin/env bash
# WMT'14 English-German for the Transformer (Vaswani et al. 2017): the corpora of fairseq's
# examples/translation/prepare-wmt14en2de.sh (Europarl v7, Common Crawl, News Commentary),
# newstest2013 as the validation set and newstest2014 (test-full) as the test set.
# Pipeline and options: bash prepare.sh --help; the steps live in ../common/prepare_steps.sh.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../common/prepare_steps.sh source-path=SCRIPTDIR
source "$HERE/../common/prepare_steps.sh"

SRC=en
TGT=de
DATA_DEFAULT=joined
BPE_MERGES_DEFAULT=32000 # fairseq's recipe uses 40000; the paper's vocabulary is ~37k shared
SPM_VOCAB_DEFAULT=37000  # "a shared source-target vocabulary of about 37000 tokens"
PAIR_USAGE="  --nc-v12           News Commentary v12 (WMT'17; fairseq's default recipe) instead of
                     v9 (WMT'14, the data of the paper)"

# Archive, URL, md5. md5 sums as published with sacrebleu (test-full) and Sockeye's
# autopilot (the others).
ARCHIVES=(
    "training-parallel-europarl-v7.tgz http://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz c52404583294a1b609e56d45b2ed06f5"
    "training-parallel-commoncrawl.tgz http://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz 7e0acbe86b0d7816300e14650f5b2bd4"
    "training-parallel-nc-v9.tgz http://www.statmt.org/wmt14/training-parallel-nc-v9.tgz 92e42b68f9d3c2ae9722e6d1c2623e21"
    "dev.tgz http://www.statmt.org/wmt14/dev.tgz 88ba3fc60b2278d59277122e1c7dd6e7"
    "test-full.tgz http://www.statmt.org/wmt14/test-full.tgz a8cd784e006feb32ac6f3d9ec7eb389a"
)
# Archive and path prefix of each training corpus (files PREFIX.en and PREFIX.de).
TRAIN_CORPORA=(
    "training-parallel-europarl-v7.tgz training/europarl-v7.de-en"
    "training-parallel-commoncrawl.tgz commoncrawl.de-en"
    "training-parallel-nc-v9.tgz training/news-commentary-v9.de-en"
)
# Archive, source SGML, reference SGML.
VALID_SETS=("dev.tgz dev/newstest2013-src.en.sgm dev/newstest2013-ref.de.sgm")
TEST_SET="test-full.tgz test-full/newstest2014-deen-src.en.sgm test-full/newstest2014-deen-ref.de.sgm"

args=()
for arg in "$@"; do
    if [[ $arg == --nc-v12 ]]; then
        ARCHIVES[2]="training-parallel-nc-v12.tgz http://data.statmt.org/wmt17/translation-task/training-parallel-nc-v12.tgz fc6b83b809347e64f511d291e4bc8731"
        TRAIN_CORPORA[2]="training-parallel-nc-v12.tgz training/news-commentary-v12.de-en"
    else
        args+=("$arg")
    fi
done
prepare_run "${args[@]}"
