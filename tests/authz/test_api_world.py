"""AZ-1 through the API alone: two tenants built with no database seeding (issue 19).

`test_matrix.py` seeds its world through the store, to afford a fresh one per change. Here the
instance admin (the first start's bootstrap) creates both workspaces, users, invitations,
agents, providers, routines and tasks over HTTP; each user signs in at `/login`, accepts its
invitation, switches its session to the workspace and creates its own API key there. Then
every subject of tenant A, via key and via cookie, gets 404 on tenant B's objects on
representative routes (tasks, runs, events, agents, providers, routines, members), while the
same routes answer on A's own objects, and B's objects are all still there afterwards.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from bullpen.api.deps import SESSION_COOKIE
from tests.support.login import HIDDEN
from tests.support.servers import RunningServer

PASSWORD = "correct horse battery staple"
PROMPT = "Analyze this dataset and extract key metrics"
ROLES = ("owner", "admin", "member", "viewer")
_CSRF = re.compile(r'name="csrf" value="([0-9a-f]+)"')


@dataclass
class Subject:
    """How one subject of a tenant calls the API."""

    key: str
    session_id: str | None = None
    csrf: str | None = None

    def headers(self, via: str, method: str) -> dict[str, str]:
        """Credentials for one request, by API key or by session cookie (CSRF when unsafe)."""
        if via == "key":
            return {"Authorization": f"Bearer {self.key}"}
        assert self.session_id is not None and self.csrf is not None
        out = {"Cookie": f"{SESSION_COOKIE}={self.session_id}"}
        if method != "GET":
            out |= {"X-CSRF-Token": self.csrf, "Sec-Fetch-Site": "same-origin"}
        return out


@dataclass
class ApiTenant:
    """A workspace built over HTTP: its subjects and its objects, by name."""

    subjects: dict[str, Subject] = field(default_factory=dict)
    objects: dict[str, str] = field(default_factory=dict)


class Api:
    """Requests to the server, failing the test on an unexpected status."""

    def __init__(self, http: aiohttp.ClientSession, server: RunningServer) -> None:
        self.http = http
        self.base = server.base_url
        self.admin = {"Authorization": f"Bearer {server.boot.api_key}"}

    async def send(
        self, method: str, path: str, headers: dict[str, str], body: Any = None, want: int = 0
    ) -> tuple[int, Any]:
        """One request; its status and JSON body (streams are not read)."""
        async with self.http.request(
            method, self.base + path, json=body, headers=headers, allow_redirects=False
        ) as resp:
            if resp.headers.get("Content-Type", "").startswith("text/event-stream"):
                return resp.status, None
            text = await resp.text()
            if want:
                assert resp.status == want, (method, path, resp.status, text)
            return resp.status, (await resp.json(content_type=None)) if text else None

    async def sign_in(self, email: str) -> tuple[str, str]:
        """Sign in at /login as a browser; the session id and the CSRF token its page shows."""
        async with self.http.get(f"{self.base}/login") as page:  # its form token and cookie
            hidden = dict(HIDDEN.findall(await page.text()))
            jar = "; ".join(f"{k}={m.value}" for k, m in page.cookies.items())
        async with self.http.post(
            f"{self.base}/login",
            data={**hidden, "email": email, "password": PASSWORD},
            headers={"Sec-Fetch-Site": "same-origin", "Cookie": jar},
            allow_redirects=False,
        ) as resp:
            assert resp.status == 303, await resp.text()
            session_id = resp.cookies[SESSION_COOKIE].value
        cookie = {"Cookie": f"{SESSION_COOKIE}={session_id}"}
        async with self.http.get(f"{self.base}/", headers=cookie) as page:
            found = _CSRF.search(await page.text())
        assert found is not None, "the dashboard shows no CSRF token"
        return session_id, found[1]


async def build_tenant(api: Api, label: str) -> ApiTenant:
    """A workspace with a user per role, an agent with a key, and one object of each type."""
    tenant = ApiTenant()
    tag = f"{label}{uuid.uuid4().hex[:6]}"
    _, ws = await api.send(
        "POST",
        "/api/v1/workspaces",
        api.admin,
        {"name": f"Tenant {tag}", "slug": f"t-{tag}", "task_key": label.upper()},
        want=201,
    )
    tenant.objects["workspace"] = ws["id"]
    # The instance admin owns the new workspace: a key of its own acts there.
    _, made = await api.send(
        "POST",
        "/api/v1/api-keys",
        api.admin,
        {"name": f"owner of {tag}", "workspace_id": ws["id"]},
        want=201,
    )
    boss = {"Authorization": f"Bearer {made['key']}"}

    for role in ROLES:
        email = f"{role}-{tag}@example.test"
        user = {"email": email, "name": role, "password": PASSWORD}
        _, created = await api.send("POST", "/api/v1/users", api.admin, user, want=201)
        invite = {"email": email, "role": role}
        _, invitation = await api.send("POST", "/api/v1/invitations", boss, invite, want=201)
        session_id, csrf = await api.sign_in(email)
        subject = Subject("", session_id, csrf)
        unsafe = subject.headers("cookie", "POST")
        _, mine = await api.send("GET", "/api/v1/users/me/invitations", unsafe, want=200)
        assert [i["id"] for i in mine["items"]] == [invitation["id"]]
        accept = f"/api/v1/users/me/invitations/{invitation['id']}/accept"
        await api.send("POST", accept, unsafe, want=200)
        switch = {"workspace_id": ws["id"]}
        await api.send("POST", "/api/v1/session/workspace", unsafe, switch, want=200)
        _, key = await api.send("POST", "/api/v1/api-keys", unsafe, {"name": role}, want=201)
        subject.key = key["key"]
        tenant.subjects[role] = subject
        tenant.objects[f"{role}_user"] = created["id"]
    tenant.objects["member"] = tenant.objects["member_user"]

    agent_body = {
        "name": f"agent-{tag}",
        "adapter": "llm",
        "config": {"provider": "simulated", "model": "sim-1"},
    }
    _, agent = await api.send("POST", "/api/v1/agents", boss, agent_body, want=201)
    tenant.objects["agent"] = agent["id"]
    _, agent_key = await api.send(
        "POST", "/api/v1/api-keys", boss, {"name": "bot", "agent_id": agent["id"]}, want=201
    )
    tenant.subjects["agent"] = Subject(agent_key["key"])
    task_body = {"prompt": PROMPT, "agent_id": agent["id"]}
    _, task = await api.send("POST", "/api/v1/tasks", boss, task_body, want=201)
    tenant.objects["task"] = task["id"]
    _, task_runs = await api.send("GET", f"/api/v1/tasks/{task['id']}/runs", boss, want=200)
    tenant.objects["run"] = task_runs["items"][0]["id"]
    provider_body = {
        "name": f"p-{tag}",
        "base_url": "https://llm.example.test/v1",
        "api_key": "sk-tenant-key",
    }
    _, provider = await api.send("POST", "/api/v1/providers", boss, provider_body, want=201)
    tenant.objects["provider"] = provider["id"]
    routine_body = {
        "name": f"r-{tag}",
        "agent_id": agent["id"],
        "cron": "0 9 * * 1-5",
        "prompt": PROMPT,
    }
    _, routine = await api.send("POST", "/api/v1/routines", boss, routine_body, want=201)
    tenant.objects["routine"] = routine["id"]
    return tenant


@dataclass
class World:
    """Tenants A and B, both built over HTTP."""

    a: ApiTenant
    b: ApiTenant


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def api_world(
    matrix_server: RunningServer, matrix_http: aiohttp.ClientSession
) -> AsyncIterator[World]:
    api = Api(matrix_http, matrix_server)
    yield World(await build_tenant(api, "a"), await build_tenant(api, "b"))


# Reads every subject may make on its own workspace's objects.
READS = [
    "/api/v1/tasks/{task}",
    "/api/v1/tasks/{task}/runs",
    "/api/v1/tasks/{task}/events",
    "/api/v1/runs/{run}",
    "/api/v1/runs/{run}/events",
    "/api/v1/agents/{agent}",
    "/api/v1/providers/{provider}",
    "/api/v1/routines/{routine}",
    "/api/v1/members/{member}",
    "/api/v1/workspaces/{workspace}",
]
# Changes an owner or admin may make on its own objects: on another tenant's, 404 as well.
WRITES = [
    ("PATCH", "/api/v1/tasks/{task}", {"priority": 1}),
    ("POST", "/api/v1/tasks/{task}/cancel", None),
    ("PATCH", "/api/v1/agents/{agent}", {"title": "Lead"}),
    ("POST", "/api/v1/agents/{agent}/pause", None),
    ("PATCH", "/api/v1/providers/{provider}", {"timeouts": {"ttft_s": 5}}),
    ("DELETE", "/api/v1/providers/{provider}", None),
    ("PATCH", "/api/v1/routines/{routine}", {"title": "Weekly"}),
    ("DELETE", "/api/v1/routines/{routine}", None),
    ("PATCH", "/api/v1/members/{member}", {"role": "viewer"}),
    ("DELETE", "/api/v1/members/{member}", None),
]
SUBJECTS = [(role, via) for role in (*ROLES, "agent") for via in ("key", "cookie")]


def _fill(path: str, objects: dict[str, str]) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: objects[m[1]], path)


@pytest.mark.asyncio(loop_scope="module")
async def test_cross_tenant_reads_are_404_in_a_world_built_through_the_api(
    api_world: World, matrix_server: RunningServer, matrix_http: aiohttp.ClientSession
) -> None:
    api = Api(matrix_http, matrix_server)
    mismatches = []
    for role, via in SUBJECTS:
        if role == "agent" and via == "cookie":
            continue
        subject = api_world.a.subjects[role]
        headers = subject.headers(via, "GET")
        for path in READS:
            own, _ = await api.send("GET", _fill(path, api_world.a.objects), headers)
            other, body = await api.send("GET", _fill(path, api_world.b.objects), headers)
            if own != 200 or other != 404:
                mismatches.append(f"{role} via {via} GET {path}: own {own}, other {other}")
            elif body is None or body.pop("instance", None) is None:
                mismatches.append(f"{role} via {via} GET {path}: not a problem document")
            elif any(value in str(body) for value in api_world.b.objects.values()):
                # `instance` (dropped above) echoes the path the caller sent.
                mismatches.append(f"{role} via {via} GET {path}: B's ids in the answer")
    assert mismatches == [], "\n".join(mismatches)


@pytest.mark.asyncio(loop_scope="module")
async def test_cross_tenant_changes_are_404_and_change_nothing(
    api_world: World, matrix_server: RunningServer, matrix_http: aiohttp.ClientSession
) -> None:
    api = Api(matrix_http, matrix_server)
    owner_b = api_world.b.subjects["owner"].headers("key", "GET")
    before = {
        path: (await api.send("GET", _fill(path, api_world.b.objects), owner_b))
        for path in READS
        if "events" not in path
    }
    mismatches = []
    for role in ("owner", "admin"):
        for via in ("key", "cookie"):
            subject = api_world.a.subjects[role]
            for method, path, body in WRITES:
                url = _fill(path, api_world.b.objects)
                status, _ = await api.send(method, url, subject.headers(via, method), body)
                if status != 404:
                    mismatches.append(f"{role} via {via} {method} {path}: {status}")
    # Every object of B is as it was.
    after = {
        path: (await api.send("GET", _fill(path, api_world.b.objects), owner_b)) for path in before
    }
    assert mismatches == [], "\n".join(mismatches)
    assert after == before
    # And A's owner can make those very changes on A's own objects (the routes work).
    owner_a = api_world.a.subjects["owner"]
    for method, path, body in WRITES:
        if path.startswith("/api/v1/members"):
            continue  # members are checked by the matrix; here they stay for the reads
        url = _fill(path, api_world.a.objects)
        status, _ = await api.send(method, url, owner_a.headers("key", method), body)
        assert status in (200, 204), (method, path, status)
