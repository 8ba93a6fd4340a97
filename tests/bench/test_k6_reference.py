"""bench/k6/reference.js, the reference scenario for k6, against a real `bullpen up`.

The k6 binary is the one the `k6` dev dependency installs beside the interpreter (what
`uv run k6` runs). Two users for a few seconds must complete tasks with no failed check; with
a wrong API key every create fails its check and the thresholds make k6 exit non-zero.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from bullpen.bench.spawn import project_root, spawn_server

SCRIPT = project_root() / "bench" / "k6" / "reference.js"
K6 = Path(sys.executable).with_name("k6")
SHORT = {"PEAK": "2", "RAMP_UP": "1s", "HOLD": "4s", "RAMP_DOWN": "1s", "STREAM_TIMEOUT": "30s"}


async def _k6(summary: Path, **env: str) -> tuple[int, str]:
    """`k6 run` of the script with `env` as its `-e` variables; exit code and output."""
    args = [str(K6), "run", "--quiet", "--no-usage-report", "--summary-export", str(summary)]
    for name, value in {**SHORT, **env}.items():
        args += ["-e", f"{name}={value}"]
    proc = await asyncio.create_subprocess_exec(
        *args,
        str(SCRIPT),
        env={**os.environ, "K6_NO_USAGE_REPORT": "true"},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


def _metric(summary: Path, name: str) -> dict[str, Any]:
    metric: dict[str, Any] = json.loads(summary.read_text())["metrics"].get(name, {})
    return metric


@pytest.mark.timeout(240)
async def test_the_k6_script_completes_tasks_and_fails_on_a_failed_check(tmp_path: Path) -> None:
    assert K6.is_file(), f"{K6} missing: run `uv sync` (k6 is a dev dependency)"
    async with spawn_server("sqlite") as server:
        ok = tmp_path / "ok.json"
        code, out = await _k6(
            ok, BASE_URL=server.base_url, API_KEY=server.api_key, AGENT_ID=server.agent_id
        )
        assert code == 0, out[-3000:]
        checks = _metric(ok, "checks")
        assert checks["fails"] == 0 and checks["passes"] > 0, checks
        assert _metric(ok, "iterations")["count"] >= 1
        assert _metric(ok, "bullpen_tasks_done")["count"] >= 1
        assert _metric(ok, "bullpen_completion")["max"] > 0
        assert _metric(ok, "http_req_failed")["passes"] == 0  # no request counted as failed

        refused = tmp_path / "refused.json"
        wrong = server.api_key[::-1]  # reversed: a key the server never issued
        code, out = await _k6(
            refused, BASE_URL=server.base_url, API_KEY=wrong, AGENT_ID=server.agent_id
        )
    assert code == 99, out[-3000:]  # k6's exit code for a failed threshold
    assert _metric(refused, "checks")["fails"] > 0
