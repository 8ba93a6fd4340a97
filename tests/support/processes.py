"""Real `bullpen` processes in tests: their environment, a free port, `bullpen up` until it
listens, the bootstrap API key, CLI commands run as processes, and `bullpen bench` reports."""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any

import pytest

from bullpen.app import open_store, utcnow
from bullpen.cli.client import request
from bullpen.security.secrets import load_secret
from bullpen.services.bootstrap import ensure_bootstrap
from bullpen.settings import Settings


def process_env(settings: Settings, **fields: Any) -> dict[str, str]:
    """The environment of a `bullpen` child on the test's database and data directory.

    Inherited `BULLPEN_*` variables are dropped; `fields` become `BULLPEN_<FIELD>` settings.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("BULLPEN_")}
    env.update(BULLPEN_DATA_DIR=str(settings.data_dir), BULLPEN_SECRET_KEY=str(settings.secret_key))
    if settings.database_url:
        env["BULLPEN_DATABASE_URL"] = settings.database_url
    env.update({f"BULLPEN_{k.upper()}": str(v) for k, v in fields.items()})
    return env


# The database pool of every process a bench test starts (its servers and workers inherit the
# environment). The suite's four workers share one PostgreSQL (`max_connections` 100), and the
# queue scenario alone runs an API and two workers, each allowed 30 connections by default:
# beside the other workers' servers that exhausted the server in CI.
BENCH_POOL = {"BULLPEN_POOL_SIZE": "8", "BULLPEN_POOL_MAX_OVERFLOW": "4"}


def bench_report(args: list[str], timeout: float) -> dict[str, Any]:
    """Run `bullpen bench` with `args` (ending in `--json`) as a process; its JSON report."""
    done = subprocess.run(
        [sys.executable, "-m", "bullpen", "bench", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **BENCH_POOL},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def log_file() -> IO[str]:
    """Where a long-running child's stderr goes: a file, never a pipe. A pipe that nobody
    reads while the child runs fills at 64 KiB, and then the child's next log line blocks its
    event loop: a test would hang on what its harness did."""
    return tempfile.TemporaryFile("w+", encoding="utf-8")


def read_log(proc: subprocess.Popen[str], log: IO[str], timeout: float) -> str:
    """Wait for `proc` to exit; what it wrote to `log` (which is closed)."""
    proc.wait(timeout)
    with log:
        log.seek(0)
        return log.read()


@dataclass
class Server:
    """A `bullpen up` process; `log` holds its stderr once it has stopped."""

    proc: subprocess.Popen[str]
    log: str = ""


@contextmanager
def bullpen_up(env: dict[str, str], port: int) -> Iterator[Server]:
    """`bullpen up` on `port`, once it listens; killed (if still running) on exit."""
    stderr = log_file()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bullpen", "up", "--quiet", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        text=True,
    )
    server = Server(proc)
    try:
        wait_until_listening(port, proc)
        yield server
    finally:
        if proc.poll() is None:
            proc.kill()
        server.log = read_log(proc, stderr, timeout=20)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing uses right now, for a child to listen on.

    It is drawn below the kernel's ephemeral range: a port from that range (what binding port 0
    gives) can be handed to any outgoing connection, and the parallel suite opens thousands,
    between this call and the child's bind. Random, so pytest-xdist workers do not collide.
    """
    low = _ephemeral_low()
    for _ in range(200):
        port = random.randrange(10_000, low)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port found in 10000-{low - 1}")


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
            return max(int(ranges.read().split()[0]), 11_000)
    except (OSError, ValueError, IndexError):
        return 32_768


def wait_until_listening(port: int, proc: subprocess.Popen[str], seconds: float = 30) -> None:
    """Return once the port accepts connections; fail if `proc` exits or time runs out first."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail("server did not start")
            time.sleep(0.05)


async def bootstrap_key(settings: Settings) -> str:
    """The first start's API key, made in process (a `bullpen init` process costs seconds)."""
    async with open_store(settings) as store:
        secret = load_secret(settings.secret_key, settings.data_dir)
        boot = await ensure_bootstrap(store, secret, utcnow)
    assert boot.api_key is not None
    return boot.api_key


@dataclass
class BullpenCli:
    """Runs `bullpen <prefix> …` as a process; keeps every output for leak checks."""

    env: dict[str, str]
    api_key: str
    prefix: tuple[str, ...] = ()
    outputs: list[str] = field(default_factory=list)

    def __call__(self, *args: str, stdin: str = "", **env: str) -> subprocess.CompletedProcess[str]:
        """Run with `stdin` as input (empty: end of file at once) and `env` added."""
        done = subprocess.run(
            [sys.executable, "-m", "bullpen", *self.prefix, *args],
            env={**self.env, **env},
            input=stdin,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        self.outputs += [done.stdout, done.stderr]
        assert "Traceback" not in done.stdout + done.stderr, done.stderr
        return done

    def ok(self, *args: str, stdin: str = "") -> str:
        """Run, expect exit 0, return stdout."""
        done = self(*args, stdin=stdin)
        assert done.returncode == 0, done.stderr
        return done.stdout


@dataclass
class ApiCli(BullpenCli):
    """`bullpen …` against a served `bullpen up`, with the API at hand to set up and check."""

    url: str = ""

    def json(self, *args: str) -> Any:
        """Run with --json, expect exit 0, return the parsed stdout."""
        return json.loads(self.ok(*args, "--json"))

    def api(self, method: str, path: str, body: Any = None) -> Any:
        """Call the API directly (to set up and check, without the CLI)."""
        status, reply = request(method, self.url, path, api_key=self.api_key, body=body)
        assert status < 300, reply
        return reply


@contextmanager
def served_cli(data_dir: Any, prefix: tuple[str, ...] = ()) -> Iterator[ApiCli]:
    """One `bullpen up` on SQLite in `data_dir`, and a CLI with its bootstrap key in
    BULLPEN_API_KEY (for a module-scoped fixture)."""
    settings = Settings(data_dir=data_dir, secret_key="t" * 40)
    env = process_env(settings)
    api_key = asyncio.run(bootstrap_key(settings))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with bullpen_up(env, port):
        yield ApiCli(
            {**env, "BULLPEN_URL": url, "BULLPEN_API_KEY": api_key, "COLUMNS": "250"},
            api_key,
            prefix,
            url=url,
        )
