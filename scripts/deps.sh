#!/usr/bin/env bash
# Installs what Bullpen needs on a fresh machine: uv, the locked Python dependencies and,
# with --browser, Debian's Chromium for the browser tests. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v uv >/dev/null 2>&1 && [ ! -x "$HOME/.local/bin/uv" ]; then
  echo "installing uv from PyPI" >&2
  python3 -m pip install --quiet uv 2>/dev/null || python3 -m pip install --quiet --user uv
fi
export PATH="$HOME/.local/bin:$PATH"
uv sync --frozen --quiet

if [ "${1:-}" = "--browser" ] && ! command -v chromium >/dev/null 2>&1; then
  echo "installing Debian's chromium for the browser tests" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi
