#!/usr/bin/env bash
# Runs Debian's PgBouncer (scripts/deps.sh --browser installs it) in transaction mode in the
# foreground, in front of a PostgreSQL server, to try Bullpen behind it on a development
# machine (docs/operations.md, "PgBouncer"). Trust authentication on 127.0.0.1: not for
# production. Ctrl-C stops it.
#   scripts/pgbouncer.sh [listen port: 6432] [PostgreSQL host:port: 127.0.0.1:5432] [user: postgres]
set -euo pipefail
PORT="${1:-6432}"
SERVER="${2:-127.0.0.1:5432}"
PGUSER_NAME="${3:-postgres}"
BIN="$(command -v pgbouncer || echo /usr/sbin/pgbouncer)"
[ -x "$BIN" ] || { echo "pgbouncer is not installed: run scripts/deps.sh --browser" >&2; exit 1; }

DIR="$(mktemp -d -t bullpen-pgbouncer.XXXXXX)"
trap 'rm -rf "$DIR"' EXIT
cat >"$DIR/pgbouncer.ini" <<INI
[databases]
* = host=${SERVER%:*} port=${SERVER##*:}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PORT
unix_socket_dir = $DIR
auth_type = trust
auth_file = $DIR/users.txt
pool_mode = transaction
default_pool_size = 20
max_client_conn = 2000
INI
echo "\"$PGUSER_NAME\" \"\"" >"$DIR/users.txt"
chmod 755 "$DIR"
AS=()
if [ "$(id -u)" -eq 0 ]; then  # PgBouncer will not run as root
  chown nobody "$DIR"
  AS=(-u nobody)
fi
echo "PgBouncer on 127.0.0.1:$PORT (transaction mode) -> $SERVER; for example:" >&2
echo "  BULLPEN_DATABASE_URL=postgresql://$PGUSER_NAME@127.0.0.1:$PORT/bullpen" \
  "BULLPEN_DATABASE_POOLER=pgbouncer" \
  "BULLPEN_DATABASE_DIRECT_URL=postgresql://$PGUSER_NAME@$SERVER/bullpen bullpen up" >&2
"$BIN" "${AS[@]}" "$DIR/pgbouncer.ini"
