"""What `bullpen up` logs on a terminal: text lines (unless BULLPEN_LOG_FORMAT says json), one
for the migrations. Off a terminal (JSON), see test_cli.py."""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.processes import free_port, wait_until_listening

MIGRATED = re.compile(r"database schema (created|migrated|up to date)")


def _env(data_dir: Path, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BULLPEN_")}
    env.update(BULLPEN_DATA_DIR=str(data_dir), **settings)
    return env


def _up(env: dict[str, str]) -> str:
    """`bullpen up --quiet` with its stderr on a terminal (a pty), until it listens, then
    SIGTERM; what it wrote there."""
    port = free_port()
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bullpen", "up", "--quiet", "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=follower,
        )
        os.close(follower)
        try:
            wait_until_listening(port, proc)  # type: ignore[arg-type]
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)
        out = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child's end is closed and all of it has been read
                break
            if not chunk:
                break
            out += chunk
        return out.decode().replace("\r\n", "\n")
    finally:
        os.close(leader)


def test_on_a_terminal_lines_are_text_unless_json_is_forced(tmp_path: Path) -> None:
    env = _env(tmp_path / "data")
    lines = _up(env).splitlines()
    [migrated] = [line for line in lines if MIGRATED.search(line)]
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d INFO +bullpen\.store\.migrate: "
        r"database schema created \(\d{4}, \d+ revisions\)",
        migrated,
    )
    assert any(line.endswith(" uvicorn.error: Application startup complete.") for line in lines)
    assert not any(line.startswith("{") or "alembic" in line for line in lines)

    # BULLPEN_LOG_FORMAT=json wins over the terminal; a second start finds the schema current.
    env["BULLPEN_LOG_FORMAT"] = "json"
    records = [json.loads(line) for line in _up(env).splitlines()]
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    [current] = [r for r in records if MIGRATED.match(r["message"])]
    assert current["logger"] == "bullpen.store.migrate" and current["level"] == "info"
    assert re.fullmatch(r"database schema up to date \(\d{4}\)", current["message"])


def test_a_bad_log_format_is_a_clear_error(tmp_path: Path) -> None:
    refused = subprocess.run(
        [sys.executable, "-m", "bullpen", "up", "--port", str(free_port())],
        env=_env(tmp_path / "data", BULLPEN_LOG_FORMAT="xml"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 1
    assert "error: invalid settings: BULLPEN_LOG_FORMAT" in refused.stderr
    assert "Traceback" not in refused.stderr + refused.stdout
    assert not (tmp_path / "data").exists()  # refused before anything was made
