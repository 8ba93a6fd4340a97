"""A real PgBouncer (Debian's 1.18, installed by scripts/deps.sh) in transaction mode, in front
of the tests' PostgreSQL server: started from a config in a temporary directory, never as a
system service, and stopped at the end.

PgBouncer refuses to run as root; as root it is started with `-u nobody`, which it switches
to once its files are read and its socket is bound.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.postgres import PG_ADMIN_URL, pg_host_port
from tests.support.processes import free_port, log_file, read_log, wait_until_listening

# Enough for one test's transactions at once, few enough that four xdist workers' PgBouncers
# stay well inside PostgreSQL's max_connections (100) beside their direct connections.
POOL_SIZE = 8


@dataclass(frozen=True)
class PgBouncer:
    """A running PgBouncer: `url(name)` reaches database `name` through it."""

    port: int

    def url(self, database: str) -> str:
        """The pooled URL of `database` (transaction mode)."""
        return f"postgresql://{_pg_user()}@127.0.0.1:{self.port}/{database}"


def _pg_user() -> str:
    return PG_ADMIN_URL.split("://", 1)[1].split("@", 1)[0].split(":", 1)[0]


def binary() -> str:
    """The pgbouncer executable (Debian puts it in /usr/sbin, often not on PATH)."""
    found = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not os.access(found, os.X_OK):
        raise RuntimeError("pgbouncer is not installed; scripts/deps.sh --browser installs it")
    return found


def config(directory: Path, port: int, pool_size: int = POOL_SIZE) -> str:
    """pgbouncer.ini: every database of the tests' server, transaction mode, trust."""
    host, pg_port = pg_host_port()
    return f"""\
[databases]
* = host={host} port={pg_port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir = {directory}
auth_type = trust
auth_file = {directory / "users.txt"}
pool_mode = transaction
default_pool_size = {pool_size}
max_client_conn = 1000
; every test database gets a pool: give server connections back soon after it is dropped
server_idle_timeout = 10
"""


@contextmanager
def running_pgbouncer(pool_size: int = POOL_SIZE) -> Iterator[PgBouncer]:
    """PgBouncer on a free port of 127.0.0.1, in transaction mode, until the block ends."""
    directory = Path(tempfile.mkdtemp(prefix="bullpen-pgbouncer-"))
    port = free_port()
    (directory / "pgbouncer.ini").write_text(config(directory, port, pool_size))
    (directory / "users.txt").write_text(f'"{_pg_user()}" ""\n')
    command = [binary()]
    if os.geteuid() == 0:  # "PgBouncer should not run as root"
        nobody = pwd.getpwnam("nobody")
        os.chown(directory, nobody.pw_uid, nobody.pw_gid)
        command += ["-u", "nobody"]
    directory.chmod(0o755)
    stderr = log_file()
    proc = subprocess.Popen(
        [*command, str(directory / "pgbouncer.ini")],
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        text=True,
    )
    started = False
    try:
        wait_until_listening(port, proc, seconds=10)
        started = True
        yield PgBouncer(port)
    finally:
        proc.terminate()
        try:
            log = read_log(proc, stderr, timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            log = read_log(proc, stderr, timeout=10)
        shutil.rmtree(directory, ignore_errors=True)
        if not started:
            pytest.fail(f"pgbouncer did not start:\n{log[-3000:]}")
