#!/usr/bin/env bash
# RNNencdec-50 / RNNencdec-30 (Cho et al., 2014a), trained exactly as RNNsearch (Bahdanau et
# al., 2015, appendix B.2): the same recipe with the other architecture.
#
#   examples/configs/rnnencdec.sh DATA_BIN [more fairseq-train flags, which override these]
#   MAXLEN=30 examples/configs/rnnencdec.sh DATA_BIN      # RNNencdec-30
ARCH=rnnencdec exec "$(dirname "${BASH_SOURCE[0]}")/rnnsearch.sh" "$@"
