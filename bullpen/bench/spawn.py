"""Start a throw-away Bullpen server (fresh SQLite data dir or fresh PostgreSQL database).

`spawn_server` runs `bullpen init --json` then `bullpen up` as subprocesses, waits for
`/healthz`, and on exit stops the server (SIGTERM, then SIGKILL after a grace period), drops the
database and removes the temporary directory. The server's stderr goes to a file so a crash can
be reported with its tail.

By default the server runs this checkout's code. `extract_revision` unpacks another git
revision (`git archive REV | tar -x`, no worktree or checkout, so the repository is never
touched) and `spawn_server(source=...)` runs that tree instead: the same interpreter and
installed dependencies, with the tree first on `PYTHONPATH` and as the working directory of
every subprocess (`init`, `sim-provider` and `up` alike).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import IO, Any, Literal
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import orjson

import bullpen
from bullpen.errors import BullpenError

__all__ = [
    "SourceTree",
    "SpawnError",
    "SpawnedFloor",
    "SpawnedServer",
    "agent_run_cap",
    "extract_revision",
    "free_port",
    "head_commit",
    "project_root",
    "spawn_floor",
    "spawn_server",
    "stop_process",
]

Backend = Literal["sqlite", "postgres"]
#: `none` starts no simulator at all (`BULLPEN_SIM_ENABLED=false`): for scenarios without runs.
SimPlacement = Literal["process", "inprocess", "none"]

READY_TIMEOUT_S = 60.0  # a loaded 2-core machine can take half a minute to import and start
INIT_TIMEOUT_S = 120.0
GIT_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0
_TAIL_BYTES = 8_192


class SpawnError(BullpenError):
    """The bench server could not be prepared, started or reached."""

    slug = "bench-spawn"
    title = "Bench server failed"


_NO_LIMIT = "1000000"
#: The per-key rate limit out of a measurement's way: its virtual users share one API key,
#: where real users would each have their own.
KEY_UNLIMITED = {"BULLPEN_RATE_LIMIT_KEY_RPS": _NO_LIMIT, "BULLPEN_RATE_LIMIT_KEY_BURST": _NO_LIMIT}
#: Every rate limit out of the way: for scenarios that measure one path flat out.
UNLIMITED = {
    **KEY_UNLIMITED,
    "BULLPEN_RATE_LIMIT_WORKSPACE_RPS": _NO_LIMIT,
    "BULLPEN_RATE_LIMIT_WORKSPACE_BURST": _NO_LIMIT,
}


@dataclass(frozen=True)
class SourceTree:
    """Bullpen's source as of one git revision, unpacked in a temporary directory."""

    ref: str
    commit: str
    path: Path


@dataclass(frozen=True)
class SpawnedServer:
    """A running server and the credentials its first start printed."""

    base_url: str
    api_key: str = field(repr=False)
    agent_id: str
    pid: int
    backend: Backend
    data_dir: Path
    stderr_path: Path
    database_url: str | None = field(repr=False)
    _proc: asyncio.subprocess.Process = field(repr=False)
    source: SourceTree | None = None
    sim_url: str | None = None  # the simulator process's base URL, with `sim="process"`
    sim_pid: int | None = None
    worker_pids: tuple[int, ...] = ()
    more_apis: tuple[tuple[str, int], ...] = ()  # the other API processes: base URL, pid
    # The first admin `bullpen init` made (the `ui` scenario signs in as it).
    admin_email: str = ""
    admin_password: str = field(default="", repr=False)
    # What each `prepare` command printed (its last JSON line), in order.
    prepared: tuple[dict[str, Any], ...] = ()

    @property
    def base_urls(self) -> list[str]:
        """Every API process's base URL, this one first."""
        return [self.base_url, *(url for url, _ in self.more_apis)]

    @property
    def api_pids(self) -> list[int]:
        """Every API process's pid, this one first."""
        return [self.pid, *(pid for _, pid in self.more_apis)]

    @property
    def returncode(self) -> int | None:
        """The exit status once the server has died, else None."""
        return self._proc.returncode

    def stderr_tail(self, max_bytes: int = _TAIL_BYTES) -> str:
        """Return the end of the server's stderr (for crash reports)."""
        return _tail(self.stderr_path, max_bytes)


def check_api_processes(backend: str, count: int, name: str = "api_processes") -> None:
    """ValueError unless `count` API processes can serve one `backend` database."""
    if count < 1 or (count > 1 and backend != "postgres"):
        raise ValueError(f"{name} must be >= 1, and 1 on SQLite (one process a data directory)")


def _bullpen_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "bullpen", *args]


def project_root() -> Path:
    """Return the directory holding the `bullpen` package this process imported."""
    return Path(bullpen.__file__).resolve().parent.parent


async def _captured(
    argv: list[str],
    *,
    timeout_s: float,
    too_long: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> tuple[int, bytes, bytes]:
    """Run a child to its end with its output captured: (exit code, stdout, stderr).

    A child still running after `timeout_s` is killed and reaped; `too_long` is the error.
    """
    proc = await asyncio.create_subprocess_exec(
        *argv,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError as exc:
        proc.kill()
        await proc.wait()
        raise SpawnError(too_long) from exc
    assert proc.returncode is not None  # communicate() waited for the exit
    return proc.returncode, out, err


async def _git(*args: str, cwd: Path) -> str:
    returncode, out, err = await _captured(
        ["git", "-C", str(cwd), *args],
        timeout_s=GIT_TIMEOUT_S,
        too_long=f"`git {' '.join(args)}` did not finish in {GIT_TIMEOUT_S:.0f} s",
    )
    if returncode != 0:
        detail = err.decode(errors="replace").strip()
        raise SpawnError(f"`git {' '.join(args)}` exited {returncode}: {detail}")
    return out.decode().strip()


async def head_commit(repo: Path | None = None) -> str:
    """Return the full commit id of HEAD in `repo` (default: this checkout)."""
    return await _git("rev-parse", "--verify", "HEAD^{commit}", cwd=repo or project_root())


async def _archive(repo: Path, commit: str, dest: Path) -> None:
    """`git archive COMMIT | tar -x -C DEST`, without a shell."""
    read_fd, write_fd = os.pipe()
    try:
        git = await asyncio.create_subprocess_exec(
            "git",
            "-C",
            str(repo),
            "archive",
            "--format=tar",
            commit,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=write_fd,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            tar = await asyncio.create_subprocess_exec(
                "tar",
                "-x",
                "-C",
                str(dest),
                stdin=read_fd,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
        except BaseException:
            git.kill()
            await git.wait()
            raise
    finally:
        # The children hold their own copies; ours must close or tar never sees EOF.
        os.close(read_fd)
        os.close(write_fd)
    try:
        (_, git_err), (_, tar_err) = await asyncio.wait_for(
            asyncio.gather(git.communicate(), tar.communicate()), GIT_TIMEOUT_S
        )
    except TimeoutError as exc:
        for proc in (git, tar):
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        raise SpawnError(f"`git archive {commit}` did not finish in {GIT_TIMEOUT_S:.0f} s") from exc
    if git.returncode != 0 or tar.returncode != 0:
        detail = (git_err + tar_err).decode(errors="replace").strip()
        raise SpawnError(
            f"`git archive {commit} | tar -x` failed ({git.returncode}/{tar.returncode}): {detail}"
        )


@contextlib.asynccontextmanager
async def extract_revision(ref: str, *, repo: Path | None = None) -> AsyncIterator[SourceTree]:
    """Unpack revision `ref` of this checkout's repository into a temporary directory.

    Only read-only git commands run (`rev-parse`, `archive`): no worktree, no checkout, no
    index change, so people working in the checkout are not disturbed. The directory is
    removed on exit.
    """
    project = repo or project_root()
    commit = await _git("rev-parse", "--verify", f"{ref}^{{commit}}", cwd=project)
    prefix = await _git("rev-parse", "--show-prefix", cwd=project)
    top = await _git("rev-parse", "--show-toplevel", cwd=project)
    tmp = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="bullpen-src-"))
    try:
        await _archive(Path(top), commit, tmp)
        path = tmp / prefix if prefix else tmp
        if not (path / "bullpen" / "__main__.py").is_file():
            raise SpawnError(f"revision {ref} ({commit[:12]}) has no bullpen/__main__.py")
        yield SourceTree(ref=ref, commit=commit, path=path)
    finally:
        await asyncio.to_thread(shutil.rmtree, tmp, ignore_errors=True)


async def _check_source(env: Mapping[str, str], source: Path) -> None:
    """Fail unless `python -m bullpen` in `source` really imports the package from there."""
    returncode, out, err = await _captured(
        [
            sys.executable,
            "-c",
            "import bullpen, os; print(os.path.realpath(os.getcwd()));"
            " print(os.path.realpath(bullpen.__file__))",
        ],
        timeout_s=INIT_TIMEOUT_S,
        too_long=f"importing bullpen from {source} took too long",
        env=env,
        cwd=source,
    )
    # The child resolves both paths, so symlinks (a linked /tmp) cannot fool the check.
    where, _, origin = out.decode().strip().partition("\n")
    if returncode != 0 or not PurePath(origin).is_relative_to(where):
        raise SpawnError(
            f"the server would not run the code in {source}: bullpen imports from "
            f"{origin} ({err.decode(errors='replace').strip()[-500:]})"
        )


def _tail(path: Path, max_bytes: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _with_database(url: str, database: str, *, scheme: str | None = None) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(scheme=scheme or parts.scheme, path=f"/{database}"))


async def _admin_execute(admin_url: str, *statements: tuple[str, tuple[Any, ...]]) -> None:
    import asyncpg  # only the postgres backend needs the driver

    try:
        conn = await asyncpg.connect(admin_url, timeout=10)
    except (OSError, asyncpg.PostgresError) as exc:
        raise SpawnError(f"cannot connect to PostgreSQL admin URL: {exc}") from exc
    try:
        for sql, args in statements:
            await conn.execute(sql, *args)
    except asyncpg.PostgresError as exc:
        raise SpawnError(f"PostgreSQL admin statement failed: {exc}") from exc
    finally:
        await conn.close()


async def _create_database(admin_url: str) -> str:
    name = f"bullpen_bench_{secrets.token_hex(6)}"
    await _admin_execute(admin_url, (f'CREATE DATABASE "{name}"', ()))
    return name


async def _drop_database(admin_url: str, name: str) -> None:
    await _admin_execute(
        admin_url,
        (
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = $1 AND pid <> pg_backend_pid()",
            (name,),
        ),
        (f'DROP DATABASE IF EXISTS "{name}"', ()),
    )


async def _run_init(
    env: dict[str, str],
    data_dir: Path,
    cwd: Path | None,
    args: tuple[str, ...] = ("init", "--json"),
    timeout_s: float = INIT_TIMEOUT_S,
) -> dict[str, Any]:
    """Run `bullpen *args` to its end; the last JSON object it printed."""
    name = f"bullpen {args[0]}"
    returncode, out, err = await _captured(
        _bullpen_argv(*args),
        timeout_s=timeout_s,
        too_long=f"`{name}` did not finish in {timeout_s:.0f} s",
        env=env,
        cwd=cwd,
    )
    (data_dir / f"{args[0]}.stderr.log").write_bytes(err)
    if returncode != 0:
        tail = err[-_TAIL_BYTES:].decode(errors="replace")
        raise SpawnError(f"`{name}` exited {returncode}:\n{tail}")
    # Use the last JSON line so stray output before it does not matter.
    for line in reversed(out.splitlines()):
        if line.strip().startswith(b"{"):
            try:
                info = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(info, dict):
                return info
    raise SpawnError(f"`{name}` printed no JSON object: {out[-500:]!r}")


async def _wait_ready(
    proc: asyncio.subprocess.Process,
    base_url: str,
    stderr_path: Path,
    timeout_s: float,
    path: str = "/healthz",
) -> None:
    deadline = time.monotonic() + timeout_s
    timeout = aiohttp.ClientTimeout(total=2.0)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while True:
            if proc.returncode is not None:
                raise SpawnError(
                    f"server exited {proc.returncode} before it was ready:\n"
                    + _tail(stderr_path, _TAIL_BYTES)
                )
            try:
                async with session.get(f"{base_url}{path}") as resp:
                    if resp.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            if time.monotonic() >= deadline:
                raise SpawnError(
                    f"server not ready at {base_url}{path} after {timeout_s:.0f} s:\n"
                    + _tail(stderr_path, _TAIL_BYTES)
                )
            await asyncio.sleep(0.1)


async def stop_process(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `STOP_GRACE_S`."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), STOP_GRACE_S)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


@contextlib.asynccontextmanager
async def spawn_server(
    backend: Backend,
    *,
    pg_admin_url: str = "postgresql://postgres@127.0.0.1:5432/test",
    port: int | None = None,
    env: Mapping[str, str] | None = None,
    sim: SimPlacement = "process",
    source: SourceTree | None = None,
    workers: int = 0,
    api_processes: int = 1,
    prepare: Sequence[tuple[str, ...]] = (),
    prepare_timeout_s: float = INIT_TIMEOUT_S,
) -> AsyncIterator[SpawnedServer]:
    """Start a fresh server on 127.0.0.1 and yield it; tear everything down on exit.

    With `workers` that many `bullpen worker` processes run beside it on the same database
    (their pids in `worker_pids`); give the server `BULLPEN_WORKER_ENABLED=false` in `env`
    for an API-only process. With `api_processes` > 1 (PostgreSQL only) that many `bullpen up`
    processes serve the same database, each on its own port (`base_urls`, `api_pids`), as
    several API processes behind a load balancer would.

    With `sim="process"` the simulated provider runs as its own process (as a real provider
    would be elsewhere), so the server's figures do not include the simulator's CPU; with
    `sim="none"` there is no simulator. With `source` the server (and its `init`) runs that
    extracted revision instead of this checkout. Each of `prepare` (`bullpen` arguments, e.g.
    `("seed-demo", "--json")`) runs after `init` and before the server starts, each within
    `prepare_timeout_s`; what it prints last as JSON is in `prepared`.
    """
    if sim not in ("process", "inprocess", "none"):
        raise ValueError(f"unknown simulator placement {sim!r}")
    if backend not in ("sqlite", "postgres"):
        raise ValueError(f"unknown backend {backend!r}")
    check_api_processes(backend, api_processes)
    data_dir = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="bullpen-bench-"))
    res = _Resources(data_dir, pg_admin_url)
    try:
        child_env = dict(os.environ)
        child_env.pop("BULLPEN_DATABASE_URL", None)
        child_env["BULLPEN_DATA_DIR"] = str(data_dir)
        database_url: str | None = None
        if backend == "postgres":
            res.database = await _create_database(pg_admin_url)
            database_url = _with_database(pg_admin_url, res.database, scheme="postgresql+asyncpg")
            child_env["BULLPEN_DATABASE_URL"] = database_url
        if sim == "none":
            child_env["BULLPEN_SIM_ENABLED"] = "false"
        cwd: Path | None = None
        if source is not None:
            cwd = source.path
            inherited = child_env.get("PYTHONPATH")
            child_env["PYTHONPATH"] = os.pathsep.join(
                [str(source.path), *([inherited] if inherited else [])]
            )
        child_env.update(env or {})
        if source is not None:
            await _check_source(child_env, source.path)

        async def start(log: IO[bytes], *args: str) -> asyncio.subprocess.Process:
            """`bullpen *args` with this server's environment, its stderr to `log`."""
            return await asyncio.create_subprocess_exec(
                *_bullpen_argv(*args),
                env=child_env,
                cwd=cwd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=log,
            )

        def up(port: int) -> tuple[str, ...]:
            return ("up", "--host", "127.0.0.1", "--port", str(port), "--quiet")

        if sim == "process":
            sim_port = free_port()
            res.sim_stderr = (data_dir / "sim.stderr.log").open("wb")
            res.sim_proc = await start(
                res.sim_stderr, "sim-provider", "--host", "127.0.0.1", "--port", str(sim_port)
            )
            sim_url = f"http://127.0.0.1:{sim_port}/v1"
            await _wait_ready(
                res.sim_proc, sim_url, data_dir / "sim.stderr.log", READY_TIMEOUT_S, "/models"
            )
            child_env["BULLPEN_SIM_URL"] = sim_url

        info = await _run_init(child_env, data_dir, cwd)
        api_key, agent_id = info.get("api_key"), info.get("agent_id")
        if not isinstance(api_key, str) or not isinstance(agent_id, str):
            # Name the keys only: the line also carries the first admin's password.
            raise SpawnError(
                "`bullpen init --json` gave no fresh api_key/agent_id (keys: "
                f"{sorted(info)}; a reused data dir or database prints api_key null)"
            )

        prepared = [
            await _run_init(child_env, data_dir, cwd, args, prepare_timeout_s) for args in prepare
        ]
        port = port or free_port()
        base_url = f"http://127.0.0.1:{port}"
        stderr_path = data_dir / "server.stderr.log"
        res.stderr_file = stderr_path.open("wb")
        res.proc = await start(res.stderr_file, *up(port))
        await _wait_ready(res.proc, base_url, stderr_path, READY_TIMEOUT_S)
        more_apis = []
        for i in range(1, api_processes):
            more_port = free_port()
            more_url = f"http://127.0.0.1:{more_port}"
            more_log = data_dir / f"server{i}.stderr.log"
            res.worker_logs.append(more_log.open("wb"))
            more = await start(res.worker_logs[-1], *up(more_port))
            res.workers.append(more)
            await _wait_ready(more, more_url, more_log, READY_TIMEOUT_S)
            more_apis.append((more_url, more.pid))
        worker_pids = []
        for i in range(workers):
            res.worker_logs.append((data_dir / f"worker{i}.stderr.log").open("wb"))
            worker = await start(res.worker_logs[-1], "worker")
            res.workers.append(worker)
            worker_pids.append(worker.pid)
        yield SpawnedServer(
            base_url=base_url,
            api_key=api_key,
            agent_id=agent_id,
            pid=res.proc.pid,
            backend=backend,
            data_dir=data_dir,
            stderr_path=stderr_path,
            database_url=database_url,
            _proc=res.proc,
            source=source,
            sim_url=child_env.get("BULLPEN_SIM_URL") if sim == "process" else None,
            sim_pid=res.sim_proc.pid if res.sim_proc is not None else None,
            worker_pids=tuple(worker_pids),
            more_apis=tuple(more_apis),
            admin_email=str(info.get("email", "")),
            admin_password=str(info.get("password") or ""),
            prepared=tuple(prepared),
        )
    except BaseException:
        # Do not let a cleanup failure hide the error that got us here.
        with contextlib.suppress(Exception):
            await res.close()
        raise
    await res.close()


@dataclass(frozen=True)
class SpawnedFloor:
    """A running floor server (`bullpen.bench.floor`): any bearer token is accepted."""

    base_url: str
    pid: int
    backend: Backend


@contextlib.asynccontextmanager
async def spawn_floor(
    backend: Backend, *, pg_admin_url: str = "postgresql://postgres@127.0.0.1:5432/test"
) -> AsyncIterator[SpawnedFloor]:
    """Start the create scenario's bare endpoint on a fresh database; tear it down on exit.

    It always runs this checkout's `python -m bullpen.bench.floor`, whatever revision the
    servers it is compared with run.
    """
    if backend not in ("sqlite", "postgres"):
        raise ValueError(f"unknown backend {backend!r}")
    data_dir = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="bullpen-floor-"))
    res = _Resources(data_dir, pg_admin_url)
    try:
        if backend == "postgres":
            res.database = await _create_database(pg_admin_url)
            url = _with_database(pg_admin_url, res.database, scheme="postgresql+asyncpg")
        else:
            url = f"sqlite:///{data_dir / 'floor.db'}"
        port = free_port()
        base_url = f"http://127.0.0.1:{port}"
        stderr_path = data_dir / "floor.stderr.log"
        res.stderr_file = stderr_path.open("wb")
        res.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "bullpen.bench.floor", "--database-url", url, "--port", str(port)),
            cwd=project_root(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=res.stderr_file,
        )
        await _wait_ready(res.proc, base_url, stderr_path, READY_TIMEOUT_S)
        yield SpawnedFloor(base_url=base_url, pid=res.proc.pid, backend=backend)
    except BaseException:
        with contextlib.suppress(Exception):
            await res.close()
        raise
    await res.close()


@dataclass(eq=False)
class _Resources:
    """What `spawn_server` has acquired so far, released in reverse order."""

    data_dir: Path
    pg_admin_url: str
    database: str | None = None
    proc: asyncio.subprocess.Process | None = None
    stderr_file: IO[bytes] | None = None
    sim_proc: asyncio.subprocess.Process | None = None
    sim_stderr: IO[bytes] | None = None
    # Processes beside the server: the other API processes, the workers.
    workers: list[asyncio.subprocess.Process] = field(default_factory=list)
    worker_logs: list[IO[bytes]] = field(default_factory=list)

    async def close(self) -> None:
        try:
            await asyncio.gather(*(stop_process(w) for w in self.workers))
            for log in self.worker_logs:
                log.close()
            if self.proc is not None:
                await stop_process(self.proc)
            if self.stderr_file is not None:
                self.stderr_file.close()
            if self.sim_proc is not None:
                await stop_process(self.sim_proc)
            if self.sim_stderr is not None:
                self.sim_stderr.close()
            if self.database is not None:
                await _drop_database(self.pg_admin_url, self.database)
                self.database = None
        finally:
            await asyncio.to_thread(shutil.rmtree, self.data_dir, ignore_errors=True)


# What a bench agent is created with besides its config: benches start its runs on the simulator
# far faster than any agent's default run-rate breaker allows (docs/agents.md), as the demo
# agent `bullpen up` creates has no such breaker either.
NO_RUN_RATE_BREAKER: dict[str, object] = {"breakers": {"runs_per_hour": None}}


async def raise_run_cap(http: aiohttp.ClientSession, server: SpawnedServer, cap: int) -> None:
    """Let the bench's agent run `cap` runs at once (an agent runs at most 10 by default, and
    a scenario measures the server, not that cap)."""
    headers = {"Authorization": f"Bearer {server.api_key}", "Content-Type": "application/json"}
    url = f"{server.base_url}/api/v1/agents/{server.agent_id}"
    body = orjson.dumps({"max_concurrent_runs": cap})
    async with http.patch(url, data=body, headers=headers) as resp:
        if resp.status != 200:
            raise SpawnError(f"could not raise the agent's run cap: {await resp.text()}")


async def agent_run_cap(http: aiohttp.ClientSession, base_url: str) -> int:
    """The most runs an agent may run at once, as the server's OpenAPI document states it
    (`AgentUpdate.max_concurrent_runs.maximum`): the bench reads the limit from outside."""
    async with http.get(f"{base_url}/openapi.json") as resp:
        if resp.status != 200:
            raise SpawnError(f"could not read the OpenAPI document: HTTP {resp.status}")
        document = orjson.loads(await resp.read())
    try:
        field = document["components"]["schemas"]["AgentUpdate"]["properties"]
        return int(field["max_concurrent_runs"]["maximum"])
    except (KeyError, TypeError, ValueError) as exc:
        raise SpawnError(f"the OpenAPI document states no agent run cap ({exc!r})") from None
