#!/usr/bin/env bash
# Make sure Debian's Chromium is on PATH: tests/integration/test_serve_browser.py drives it through Playwright
# (which cannot download its own browsers here). Installs it with apt-get (through sudo when not
# root); where that is impossible, says so in one line and exits 1, before any test runs.
set -uo pipefail
command -v chromium >/dev/null && exit 0
ask="error: the tests need Debian's Chromium (tests/integration/test_serve_browser.py): install it, e.g. sudo apt-get install -y chromium, then run this again"
command -v apt-get >/dev/null || { echo "$ask" >&2; exit 1; }
sudo=()
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "$ask" >&2; exit 1; }
    sudo=(sudo)
fi
echo "== installing Debian's chromium for tests/integration/test_serve_browser.py: ${sudo[*]}${sudo:+ }apt-get install -y chromium"
"${sudo[@]}" apt-get update -qq && "${sudo[@]}" apt-get install -y -qq chromium >/dev/null
command -v chromium >/dev/null || { echo "$ask" >&2; exit 1; }
