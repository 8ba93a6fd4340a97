"""The reference scenario, small and untimed, against real server processes on both backends.

`bullpen init` + `bullpen up` run as subprocesses (as `bullpen bench` starts them); the bench
load client drives them: create, stream to the end, think. Every task must end `done`, its
event sequence gap-free (the client counts gaps as errors), and the stored result must equal
the text the client streamed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from bullpen.bench.loadgen import run_load
from bullpen.bench.spawn import spawn_server
from bullpen.bench.stages import Stage
from tests.support.modules import listing_env, loaded_modules
from tests.support.postgres import PG_ADMIN_URL

STAGES = [Stage(1.5, 6, "ramp"), Stage(3.0, 6, "hold"), Stage(0.5, 0, "down")]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_every_task_ends_done_with_the_streamed_text(backend: str, tmp_path: Path) -> None:
    env = {
        "BULLPEN_SIM_TTFT_MS": "40",
        "BULLPEN_SIM_TOKENS_PER_SECOND": "400",
        **listing_env(tmp_path),
    }
    async with spawn_server(backend, pg_admin_url=PG_ADMIN_URL, env=env) as server:  # type: ignore[arg-type]
        result = await run_load(
            server.base_url,
            server.api_key,
            server.agent_id,
            STAGES,
            think_s=0.1,
            keep_texts=True,
        )
        assert result.error_kinds == [], result.error_examples
        assert result.total.errors_total == 0, result.error_examples
        assert result.texts and len(result.texts) == result.total.completed >= 12
        # The bench joined every run with the provider TTFT the server recorded for it.
        assert result.total.provider_ttft_ms.count == result.total.completed
        assert result.total.provider_ttft_ms.mean >= 40  # the simulator's configured TTFT
        headers = {"Authorization": f"Bearer {server.api_key}"}
        async with aiohttp.ClientSession(headers=headers) as http:
            for task_id, streamed in result.texts.items():
                async with http.get(f"{server.base_url}/api/v1/tasks/{task_id}") as resp:
                    task = await resp.json()
                assert task["status"] == "done"
                assert task["result"] == streamed and streamed
                assert task["run"]["output_tokens"] == 64
        # PostgreSQL's driver and SQLAlchemy's dialect for it are imported only where they
        # are used: on SQLite they would be memory for nothing (about 7 MB).
        loaded = await asyncio.to_thread(loaded_modules, server.pid, tmp_path)
        for module in ("asyncpg", "sqlalchemy.dialects.postgresql"):
            assert (module in loaded) is (backend == "postgres"), module
