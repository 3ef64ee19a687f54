#!/usr/bin/env bash
# Install onnxruntime-web (pinned) for the page fairseq-plugins-export-onnx writes into its folder:
# the exporter copies its JavaScript and WebAssembly files from here, so the page needs no CDN.
# Re-running is a no-op once the pinned version is there. Usage:
#   bash scripts/setup_onnx_web.sh            # into ${FAIRSEQ_PLUGINS_ONNX_WEB:-~/.cache/fairseq-plugins/onnxruntime-web}
set -euo pipefail
VERSION=1.23.2
DEST=${FAIRSEQ_PLUGINS_ONNX_WEB:-${XDG_CACHE_HOME:-$HOME/.cache}/fairseq-plugins/onnxruntime-web}
package="$DEST/node_modules/onnxruntime-web/package.json"
if [ -f "$package" ] && grep -q "\"version\": \"$VERSION\"" "$package"; then
    exit 0
fi
command -v npm >/dev/null || { echo "error: npm is needed to install onnxruntime-web (apt-get install npm)" >&2; exit 2; }
mkdir -p "$DEST"
echo "== installing onnxruntime-web $VERSION into $DEST"
log="$DEST/npm-install.log"
npm install --prefix "$DEST" --no-save --no-audit --no-fund --ignore-scripts "onnxruntime-web@$VERSION" >"$log" 2>&1 || {
    echo "error: npm install onnxruntime-web@$VERSION failed: $(grep -m1 -i 'err' "$log" || tail -n1 "$log") (whole output: $log)" >&2
    exit 1; }
