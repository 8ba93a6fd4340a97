"""The commands a new user runs: `bullpen up` prints a curl line that streams; restarts reuse."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.modules import listing_env, loaded_modules
from tests.support.processes import free_port, wait_until_listening


def _env(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BULLPEN_")}
    env.update(
        BULLPEN_DATA_DIR=str(data_dir),
        BULLPEN_SIM_TTFT_MS="20",
        BULLPEN_SIM_TOKENS_PER_SECOND="500",
        **listing_env(data_dir.parent / "modules"),
    )
    return env


def _bullpen(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bullpen", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_init_is_idempotent_and_shows_secrets_once(tmp_path: Path) -> None:
    env = _env(tmp_path / "data")
    first = json.loads(_bullpen("init", "--json", env=env).stdout)
    second = json.loads(_bullpen("init", "--json", env=env).stdout)
    assert first["created"] and first["api_key"].startswith("bp_") and first["password"]
    assert not second["created"] and second["api_key"] is None and second["password"] is None
    assert second["agent_id"] == first["agent_id"]
    assert second["workspace_id"] == first["workspace_id"]
    migrated = _bullpen("migrate", env=env)
    assert migrated.returncode == 0, migrated.stderr
    assert oct((tmp_path / "data" / "secret.key").stat().st_mode & 0o777) == "0o600"


def test_the_printed_curl_line_streams_a_completion(tmp_path: Path) -> None:
    stderr = _up_and_run_the_curl_line(_env(tmp_path / "data"))
    assert "bp_" not in stderr.split("Create a task")[-1]  # the key appears only in the banner
    # Off a terminal the logs are JSON lines; a new database's migrations are one of them.
    [migrated] = _migration_messages(stderr)
    assert re.fullmatch(r"database schema created \(\d{4}, \d+ revisions\)", migrated)


def test_on_a_later_start_the_curl_line_works_with_the_key_in_the_environment(
    tmp_path: Path,
) -> None:
    """Issue 20: a later start has no key to print; its curl line names $BULLPEN_API_KEY, and
    it once did so inside single quotes, where the shell never expands it."""
    env = _env(tmp_path / "data")
    first = json.loads(_bullpen("init", "--json", env=env).stdout)
    stderr = _up_and_run_the_curl_line(env, BULLPEN_API_KEY=first["api_key"])
    [migrated] = _migration_messages(stderr)
    assert re.fullmatch(r"database schema up to date \(\d{4}\)", migrated)


def _migration_messages(stderr: str) -> list[str]:
    """What the migrations logged; every log line (the banner's are not JSON) must parse and
    carry time, level, logger and message, and alembic's own lines stay silent."""
    records = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    assert records and all({"time", "level", "logger", "message"} <= set(r) for r in records)
    assert not [r for r in records if r["logger"].startswith("alembic")]
    return [r["message"] for r in records if r["logger"] == "bullpen.store.migrate"]


def _up_and_run_the_curl_line(env: dict[str, str], **shell_env: str) -> str:
    """`bullpen up`, its printed curl line run by bash (with `shell_env` added), the stream
    checked; returns the server's stderr once it has stopped."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bullpen", "up", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        curl_line = proc.stdout.readline().strip()
        assert curl_line.startswith("curl ") and f"127.0.0.1:{port}" in curl_line
        wait_until_listening(port, proc)
        streamed = subprocess.run(
            ["bash", "-c", curl_line],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
            env={**env, **shell_env},
        ).stdout
        assert "event: text" in streamed
        assert 'event: end\ndata: {"status":"done"}' in streamed
        assert streamed.rstrip().endswith('data: {"reason":"task-ended","status":"done"}')
        # A server that printed its banner and served a task has not loaded rich (the CLI's
        # tables and errors use it) nor PostgreSQL's driver: each is memory for nothing. (A
        # first start runs the migrations, which name PostgreSQL's types: the dialect is
        # checked in test_reference_scenario.py, on a server started after `bullpen init`.)
        loaded = loaded_modules(proc.pid, Path(env["BULLPEN_TEST_MODULES_DIR"]))
        assert "bullpen.api.app" in loaded
        assert not {"rich", "asyncpg"} & loaded
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
    # uvicorn re-raises SIGTERM after a clean shutdown, so -15 is a clean exit too.
    assert proc.returncode in (0, -signal.SIGTERM), stderr[-2000:]
    assert "Application shutdown complete" in stderr
    return stderr
