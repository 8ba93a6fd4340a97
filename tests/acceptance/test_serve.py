"""`bullpen serve` and `--processes N` (issue 21): several API processes on one port without a
balancer, as real processes on loopback.

Which process served a connection is read from /proc: the server side of an open connection is
a socket in exactly one process's descriptor table, the one that accepted it.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import aiohttp
import pytest
import sqlalchemy as sa

from bullpen.app import open_store
from bullpen.settings import Settings
from bullpen.store.tables import api_keys, users
from tests.support.cluster import workers
from tests.support.processes import (
    bootstrap_key,
    free_port,
    log_file,
    process_env,
    wait_until_listening,
)
from tests.support.servers import FAST_SIM

STARTED_S = 90.0  # a child's start imports the app: seconds each, on a busy machine more
TASK_DONE_S = 90.0  # a worker process's own start included


@contextmanager
def bullpen_processes(
    env: dict[str, str], command: str, port: int, processes: int, *extra: str, wait: bool = True
) -> Iterator[tuple[subprocess.Popen[str], IO[str], IO[str]]]:
    """`bullpen <command> --processes N` on `port` once it listens (a child listens once it
    serves) unless not `wait`: the parent, its stdout and its stderr (files); killed with its
    children if the test leaves it running."""
    stdout, stderr = log_file(), log_file()
    args = ["--port", str(port), "--processes", str(processes), *extra]
    proc = subprocess.Popen(
        [sys.executable, "-m", "bullpen", command, *args],
        env=env,
        stdout=stdout,
        stderr=stderr,
        text=True,
    )
    try:
        if wait:
            wait_until_listening(port, proc, seconds=STARTED_S)
        yield proc, stdout, stderr
    finally:
        if proc.poll() is None:
            for pid in children(proc.pid):
                os.kill(pid, signal.SIGKILL)
            proc.kill()
        proc.wait(30)
        stdout.close()
        stderr.close()


def children(parent: int) -> dict[int, str]:
    """The processes whose parent is `parent`, with their command lines."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
            found[int(entry.name)] = cmdline
    return found


def servers(parent: int, count: int, *, besides: frozenset[int] = frozenset()) -> list[int]:
    """The parent's `count` server children (spawned, unlike its resource tracker), none of
    them in `besides`; waits for them to exist."""
    deadline = time.monotonic() + STARTED_S
    while True:
        found = sorted(pid for pid, cmd in children(parent).items() if "spawn_main" in cmd)
        if len(found) == count and not besides & set(found):
            return found
        assert time.monotonic() < deadline, (found, besides)
        time.sleep(0.05)


def served_by(port: int, candidates: list[int]) -> int:
    """Open a connection to `port`, get /healthz on it and, while it is still open, the pid
    among `candidates` holding its server side."""
    with socket.create_connection(("127.0.0.1", port), timeout=STARTED_S) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(4096)
            assert chunk, head
            head += chunk
        assert head.startswith(b"HTTP/1.1 200 "), head
        inode = _server_side_inode(port, conn.getsockname()[1])
        owners = [pid for pid in candidates if _holds(pid, inode)]
    assert len(owners) == 1, (owners, candidates)
    return owners[0]


def _server_side_inode(port: int, client_port: int) -> str:
    """The inode of the accepted socket whose peer is 127.0.0.1:`client_port`."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = fields[1], fields[2]
        if int(local.split(":")[1], 16) == port and int(remote.split(":")[1], 16) == client_port:
            return fields[9]
    raise AssertionError(f"no server side of the connection from port {client_port}")


def _holds(pid: int, inode: str) -> bool:
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except FileNotFoundError:  # gone since it was listed (a child just killed): holds nothing
        return False
    for fd in fds:
        try:
            if os.readlink(fd) == f"socket:[{inode}]":
                return True
        except OSError:
            continue
    return False


def wait_gone(pids: set[int]) -> None:
    """Wait until none of `pids` exists any more (not even as a zombie)."""
    deadline = time.monotonic() + 30
    while alive := {pid for pid in pids if Path(f"/proc/{pid}").exists()}:
        assert time.monotonic() < deadline, f"left running: {alive}"
        time.sleep(0.05)


async def run_a_task(port: int, api_key: str, agent_id: str) -> dict[str, Any]:
    """Create a task through the API on `port` and wait for it to end."""
    base = f"http://127.0.0.1:{port}/api/v1/tasks"
    headers = {"Authorization": f"Bearer {api_key}"}
    body = {"prompt": "Summarise the quarterly report", "agent_id": agent_id}
    async with aiohttp.ClientSession(headers=headers) as http:
        async with http.post(base, json=body) as resp:
            assert resp.status == 201, await resp.text()
            task: dict[str, Any] = await resp.json()
        deadline = time.monotonic() + TASK_DONE_S
        while task["status"] not in ("done", "failed", "cancelled"):
            assert time.monotonic() < deadline, task
            await asyncio.sleep(0.1)
            async with http.get(f"{base}/{task['id']}") as resp:
                task = await resp.json()
    return task


def _read(log: IO[str]) -> str:
    """What a running child has written to `log` so far (read without moving the offset it
    writes at, which it shares with this process)."""
    fd = log.fileno()
    return os.pread(fd, os.fstat(fd).st_size, 0).decode()


def wait_logged(log: IO[str], line: str, times: int) -> None:
    """Wait until `line` is in `log` `times` times."""
    deadline = time.monotonic() + STARTED_S
    while (found := _read(log).count(line)) < times:
        assert time.monotonic() < deadline, (line, found, _read(log)[-5000:])
        time.sleep(0.05)


@pytest.mark.timeout(300)  # five `bullpen` processes start, two at once, on a shared machine
@pytest.mark.parametrize("backend", ["postgres"])
async def test_serve_processes_share_one_port_beside_a_worker(settings: Settings) -> None:
    env = process_env(settings, **FAST_SIM)
    port = free_port()
    with bullpen_processes(env, "serve", port, 2) as (proc, out, err):
        first, second = servers(proc.pid, 2)
        wait_logged(err, "Application startup complete", 2)

        # One port, two processes accepting on it: while the one that served is stopped, the
        # other answers.
        one = served_by(port, [first, second])
        os.kill(one, signal.SIGSTOP)
        try:
            other = served_by(port, [first, second])
        finally:
            os.kill(one, signal.SIGCONT)
        assert {one, other} == {first, second}

        # The bootstrap ran once, in the parent, before the children: one banner, one key.
        [curl_line] = _read(out).splitlines()
        [api_key] = set(re.findall(r"Bearer (bp_[\w-]+)'", curl_line))
        [agent_id] = re.findall(r'"agent_id": "([0-9a-f-]{36})"', curl_line)
        assert _read(err).count(f"API key:   {api_key}") == 1
        async with open_store(settings) as store, store.read() as conn:
            assert await conn.scalar(sa.select(sa.func.count()).select_from(api_keys)) == 1
            assert await conn.scalar(sa.select(sa.func.count()).select_from(users)) == 1

        # No worker runs in `serve`: a task created through it is run by a `bullpen worker`.
        with workers(env) as pool:
            pool.start(1)
            task = await run_a_task(port, api_key, agent_id)
        assert task["status"] == "done", task

        # A child that dies is replaced; the other one serves meanwhile.
        os.kill(one, signal.SIGKILL)
        assert served_by(port, sorted({other, *children(proc.pid)})) != one
        [replacement] = set(servers(proc.pid, 2, besides=frozenset({one}))) - {other}
        wait_logged(err, "Application startup complete", 3)
        assert served_by(port, [other, replacement]) in (other, replacement)
        everyone = set(children(proc.pid))

        # SIGTERM to the parent: every child stops after a clean shutdown, the parent exits 0.
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, _read(err)[-3000:]
        wait_gone(everyone)
        log = _read(err)
        assert f"Child process [{one}] died" in log
        for pid in (other, replacement):
            assert f"Finished server process [{pid}]" in log
        assert log.count("Application shutdown complete") == 2
        assert "Traceback" not in log


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["postgres"])
async def test_up_processes_each_run_a_worker(settings: Settings) -> None:
    api_key = await bootstrap_key(settings)
    env = process_env(settings, **FAST_SIM)
    port = free_port()
    async with open_store(settings) as store, store.read() as conn:
        agent_id = str(await conn.scalar(sa.text("SELECT id FROM agents")))
    with bullpen_processes(env, "up", port, 2, "--quiet") as (proc, _, err):
        pids = servers(proc.pid, 2)
        everyone = set(children(proc.pid))
        wait_logged(err, "Application startup complete", 2)
        task = await run_a_task(port, api_key, agent_id)
        assert task["status"] == "done", task
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, _read(err)[-3000:]
        wait_gone(everyone)
        log = _read(err)
        for pid in pids:
            assert f"Finished server process [{pid}]" in log
        assert "Traceback" not in log


@pytest.mark.parametrize("backend", ["postgres"])
async def test_a_child_that_cannot_start_stops_the_command(settings: Settings) -> None:
    """A start-up failure would repeat in every replacement: the command exits 1. The vehicle
    is a setting only the app reads as it starts (the parent's bootstrap does not)."""
    env = process_env(settings, outbound_allow="10.0.0.0/99")
    port = free_port()
    with bullpen_processes(env, "serve", port, 2, "--quiet", wait=False) as (proc, _, err):
        wait_logged(err, "Application startup failed", 1)
        everyone = set(children(proc.pid))
        assert proc.wait(90) == 1
        wait_gone(everyone)
        log = _read(err)
    assert "Application startup failed" in log
    assert "failed to start, stopping the parent process" in log


def _refused(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "bullpen", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0, done
    assert "Traceback" not in done.stdout + done.stderr
    return done


def test_several_processes_and_serve_are_refused_on_sqlite(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BULLPEN_")}
    data = tmp_path / "data"
    done = _refused(["up", "--processes", "2", "--data-dir", str(data)], env)
    assert done.returncode == 1
    assert "error: --processes 2 needs PostgreSQL" in done.stderr
    done = _refused(["up", "--data-dir", str(data)], {**env, "BULLPEN_PROCESSES": "3"})
    assert "error: --processes 3 needs PostgreSQL" in done.stderr
    # `serve` runs no worker, and none could share a SQLite data directory with it.
    for processes in ("1", "2"):
        done = _refused(["serve", "--processes", processes, "--data-dir", str(data)], env)
        assert done.returncode == 1
        assert "error: bullpen serve needs PostgreSQL" in done.stderr
    assert not data.exists()  # refused before anything was made


def test_zero_processes_are_refused(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BULLPEN_")}
    data = tmp_path / "data"
    for command in ("serve", "up"):
        done = _refused([command, "--processes", "0", "--data-dir", str(data)], env)
        assert done.returncode == 2
        assert "Invalid value for '--processes'" in done.stdout + done.stderr
    assert not data.exists()
