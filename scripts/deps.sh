#!/usr/bin/env bash
# Installs what Bullpen needs on a fresh machine: uv, the locked Python dependencies and,
# with --browser, Debian's Chromium and PgBouncer for the tests. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v uv >/dev/null 2>&1 && [ ! -x "$HOME/.local/bin/uv" ]; then
  echo "installing uv from PyPI" >&2
  python3 -m pip install --quiet uv 2>/dev/null || python3 -m pip install --quiet --user uv
fi
export PATH="$HOME/.local/bin:$PATH"
uv sync --frozen --quiet

# With --browser (make test), the Debian packages the tests run: Chromium for the browser
# tests, and PgBouncer (1.18, in /usr/sbin) for the tests through a transaction-mode pooler,
# which start their own pgbouncer from a temporary config (tests/support/pgbouncer.py).
if [ "${1:-}" = "--browser" ]; then
  missing=()
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer)
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing Debian's ${missing[*]} for the tests" >&2
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi
