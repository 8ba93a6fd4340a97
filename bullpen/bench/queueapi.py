"""The queue bench's client: what it does to a server, all of it over the public HTTP API.

Tasks are created as any client creates them (`POST /api/v1/tasks`, which commits the task and
its run and wakes the workers), and read back with their latest run's own timestamps
(`queued_at`, `started_at`, `finished_at`) from `GET /api/v1/tasks`. A second workspace is made
as a person would: the first admin signs in through the login form, creates it, switches the
session to it and creates an API key there.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import aiohttp
import orjson

from bullpen.bench.spawn import NO_RUN_RATE_BREAKER, SpawnError, agent_run_cap

PAGE = 100  # the API's largest page
_HIDDEN_CSRF = re.compile(r'<input type="hidden" name="csrf" value="([^"]*)"')
_SAME_ORIGIN = {"Sec-Fetch-Site": "same-origin"}


@dataclass(frozen=True)
class RunTimes:
    """A task's latest run, as the API shows it: status and timestamps."""

    task_id: str
    status: str
    queued_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    @classmethod
    def of(cls, task: dict[str, Any]) -> RunTimes:
        """From one item of `GET /api/v1/tasks` (or `GET /api/v1/tasks/{id}`)."""
        run = task["run"]

        def at(name: str) -> datetime | None:
            value = run.get(name)
            return datetime.fromisoformat(value) if value else None

        queued = at("queued_at")
        assert queued is not None
        return cls(task["id"], run["status"], queued, at("started_at"), at("finished_at"))


class QueueClient:
    """One workspace's API key on one server: create tasks, read their runs, set agents' caps."""

    def __init__(self, http: aiohttp.ClientSession, base_url: str, api_key: str) -> None:
        self.http = http
        self.base_url = base_url
        self._headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}

    async def _call(self, method: str, path: str, body: Any = None, want: int = 200) -> Any:
        data = orjson.dumps(body) if body is not None else None
        async with self.http.request(
            method, self.base_url + path, data=data, headers=self._headers
        ) as resp:
            raw = await resp.read()
            if resp.status != want:
                raise SpawnError(f"{method} {path}: HTTP {resp.status}: {raw[:300]!r}")
        return orjson.loads(raw) if raw else None

    async def create_task(self, agent_id: str, prompt: str) -> str:
        """Create one task (its run queued, the workers woken); its id."""
        body = {"agent_id": agent_id, "title": "bench", "prompt": prompt}
        created = await self._call("POST", "/api/v1/tasks", body, want=201)
        return str(created["id"])

    async def create_tasks(
        self, agent_id: str, count: int, prompt: str, *, in_flight: int = 16
    ) -> list[str]:
        """Create `count` tasks, `in_flight` requests at a time; their ids."""
        ids: list[str] = []
        left = iter(range(count))

        async def client() -> None:
            for _ in left:
                ids.append(await self.create_task(agent_id, prompt))

        await asyncio.gather(*(client() for _ in range(min(in_flight, count))))
        return ids

    async def tasks(self, status: str | None = None, *, limit: int | None = None) -> list[Any]:
        """The workspace's tasks (newest first), every page or the first `limit` items."""
        items: list[Any] = []
        cursor: str | None = None
        while True:
            query = f"?limit={PAGE if limit is None else min(PAGE, limit)}"
            if status is not None:
                query += f"&status={status}"
            if cursor is not None:
                query += f"&cursor={cursor}"
            page = await self._call("GET", "/api/v1/tasks" + query)
            items += page["items"]
            cursor = page["next_cursor"]
            if cursor is None or (limit is not None and len(items) >= limit):
                return items

    async def runs(self, task_ids: Iterable[str] | None = None) -> list[RunTimes]:
        """The latest run of every task (or of those given)."""
        wanted = None if task_ids is None else set(task_ids)
        return [RunTimes.of(t) for t in await self.tasks() if wanted is None or t["id"] in wanted]

    async def count(self, status: str) -> int:
        """How many of the workspace's tasks are in `status`."""
        return len(await self.tasks(status))

    async def pending(self) -> bool:
        """Whether any task is still queued or running."""
        for status in ("queued", "running"):
            if await self.tasks(status, limit=1):
                return True
        return False

    async def cap(self, agent_id: str, runs: int) -> None:
        """Let the agent run at most `runs` runs at once."""
        await self._call("PATCH", f"/api/v1/agents/{agent_id}", {"max_concurrent_runs": runs})

    async def uncap(self, agent_id: str) -> None:
        """Let the agent run as many runs at once as the API allows (its stated maximum)."""
        cap = await agent_run_cap(self.http, self.base_url)
        await self._call("PATCH", f"/api/v1/agents/{agent_id}", {"max_concurrent_runs": cap})

    async def create_agent(self, name: str) -> str:
        """An agent of the built-in simulated provider, uncapped; its id."""
        cap = await agent_run_cap(self.http, self.base_url)
        body = {
            "name": name,
            "adapter": "llm",
            "config": {"provider": "simulated", "model": "sim-1"},
            "max_concurrent_runs": cap,
            **NO_RUN_RATE_BREAKER,
        }
        return str((await self._call("POST", "/api/v1/agents", body, want=201))["id"])


async def second_workspace(base_url: str, email: str, password: str) -> str:
    """Workspace "B", made by the first admin through the login form and the API; a key in it.

    The admin signs in, creates the workspace (its owner), switches the session to it and
    creates an API key there: what the UI does, with the session's CSRF token from its page.
    """
    jar = aiohttp.CookieJar(unsafe=True)  # cookies of 127.0.0.1 (an IP address)
    async with aiohttp.ClientSession(cookie_jar=jar) as browser:

        async def page_token(path: str) -> str:
            async with browser.get(base_url + path, headers=_SAME_ORIGIN) as resp:
                found = _HIDDEN_CSRF.search(await resp.text())
            if resp.status != 200 or found is None:
                raise SpawnError(f"GET {path}: HTTP {resp.status}, no form token")
            return found.group(1)

        form = {"csrf": await page_token("/login"), "email": email, "password": password}
        async with browser.post(
            base_url + "/login", data=form, headers=_SAME_ORIGIN, allow_redirects=False
        ) as resp:
            if resp.status != 303:
                raise SpawnError(f"the bench could not sign in: HTTP {resp.status}")
        headers = {**_SAME_ORIGIN, "X-CSRF-Token": await page_token("/")}

        async def post(path: str, body: dict[str, Any], want: int) -> Any:
            async with browser.post(base_url + path, json=body, headers=headers) as resp:
                raw = await resp.read()
                if resp.status != want:
                    raise SpawnError(f"POST {path}: HTTP {resp.status}: {raw[:300]!r}")
            return orjson.loads(raw)

        workspace = {"name": "B", "slug": "bench-b", "task_key": "B"}
        made = await post("/api/v1/workspaces", workspace, 201)
        await post("/api/v1/session/workspace", {"workspace_id": made["id"]}, 200)
        key = await post("/api/v1/api-keys", {"name": "queue bench"}, 201)
    return str(key["key"])
