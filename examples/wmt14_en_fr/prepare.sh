#!/usr/bin/env bash
# WMT'14 English-French: the corpora of fairseq's examples/translation/prepare-wmt14en2fr.sh
# (Europarl v7, Common Crawl, UN, News Commentary v9, 10^9 French-English), newstest2012 +
# newstest2013 as the validation set (Bahdanau et al. 2015) and newstest2014 (test-full).
# Builds three binarized sets: joined subwords (Transformer), 30k-word vocabularies
# (RNNsearch, RNNencdec) and 160k/80k-word vocabularies (seq2seq LSTM).
# Pipeline and options: bash prepare.sh --help; the steps live in ../common/prepare_steps.sh.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../common/prepare_steps.sh source-path=SCRIPTDIR
source "$HERE/../common/prepare_steps.sh"

SRC=en
TGT=fr
DATA_DEFAULT=joined,words30k,words160k
BPE_MERGES_DEFAULT=40000 # as fairseq's recipe; the paper used a 32000 word-piece vocabulary
SPM_VOCAB_DEFAULT=32000
PAIR_USAGE=""

# Archive, URL, md5. md5 sums as published with sacrebleu (test-full) and Sockeye's
# autopilot (the others).
ARCHIVES=(
    "training-parallel-europarl-v7.tgz http://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz c52404583294a1b609e56d45b2ed06f5"
    "training-parallel-commoncrawl.tgz http://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz 7e0acbe86b0d7816300e14650f5b2bd4"
    "training-parallel-un.tgz http://www.statmt.org/wmt13/training-parallel-un.tgz bb25a213ba9140023e4cc82c778bef53"
    "training-parallel-nc-v9.tgz http://www.statmt.org/wmt14/training-parallel-nc-v9.tgz 92e42b68f9d3c2ae9722e6d1c2623e21"
    "training-giga-fren.tar http://www.statmt.org/wmt10/training-giga-fren.tar 0b12e20027d5b5f0dfcca290c72c8953"
    "dev.tgz http://www.statmt.org/wmt14/dev.tgz 88ba3fc60b2278d59277122e1c7dd6e7"
    "test-full.tgz http://www.statmt.org/wmt14/test-full.tgz a8cd784e006feb32ac6f3d9ec7eb389a"
)
# Archive, path prefix of each training corpus (files PREFIX.en, PREFIX.fr) and an optional
# suffix of both files (.gz: read compressed).
TRAIN_CORPORA=(
    "training-parallel-europarl-v7.tgz training/europarl-v7.fr-en"
    "training-parallel-commoncrawl.tgz commoncrawl.fr-en"
    "training-parallel-un.tgz un/undoc.2000.fr-en"
    "training-parallel-nc-v9.tgz training/news-commentary-v9.fr-en"
    "training-giga-fren.tar giga-fren.release2.fixed .gz"
)
# Archive, source SGML, reference SGML.
VALID_SETS=(
    "dev.tgz dev/newstest2012-src.en.sgm dev/newstest2012-ref.fr.sgm"
    "dev.tgz dev/newstest2013-src.en.sgm dev/newstest2013-ref.fr.sgm"
)
TEST_SET="test-full.tgz test-full/newstest2014-fren-src.en.sgm test-full/newstest2014-fren-ref.fr.sgm"

prepare_run "$@"
