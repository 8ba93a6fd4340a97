"""The authorization matrix (TEST-PLAN AZ-1, AZ-2, AZ-3), generated from `matrix.toml`.

For every route in the file and every subject (each role via API key and via cookie, an
agent's key, anonymous): the status on its own workspace's object matches the file; on the
other workspace's object it is 404 (or the same 403 when the route itself is refused); a
refused request leaves every row unchanged; each 403 is in the audit log. The route list in the
file must equal the app's API routes, so a new route cannot ship without a row.
"""

from __future__ import annotations

import json
import re
import tomllib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import sqlalchemy as sa

from bullpen.api.app import API_ROUTERS
from bullpen.api.deps import access_of
from bullpen.store.tables import audit_events
from tests.support.servers import RunningServer
from tests.support.world import Tenant, drop_tenant, fingerprint, is_user, seed_tenant

MATRIX = tomllib.loads((Path(__file__).parent / "matrix.toml").read_text())["route"]
SUBJECTS = [
    (role, via)
    for role in ("owner", "admin", "member", "viewer", "instance_admin", "agent")
    for via in ("key", "cookie")
    if via == "key" or is_user(role)
]
UNSAFE = {"POST", "PUT", "PATCH", "DELETE"}
_PLACEHOLDER = re.compile(r"\{(\w+)(?::\w+)?\}")


@dataclass
class Route:
    method: str
    path: str
    body: Any
    expect: dict[str, int]
    cross: dict[str, int]

    @classmethod
    def parse(cls, row: dict[str, Any]) -> Route:
        method, path = row["op"].split(" ", 1)
        return cls(method, path, row.get("body"), row["expect"], row.get("cross", {}))

    @property
    def names_an_object(self) -> bool:
        text = self.path + json.dumps(self.body)
        return any(name != "unique" for name in _PLACEHOLDER.findall(text))

    def cross_expect(self, role: str) -> int:
        if role in self.cross:
            return self.cross[role]
        own = self.expect[role]
        return 404 if own < 300 or own == 404 else own


ROUTES = [Route.parse(row) for row in MATRIX]


def test_the_matrix_covers_every_api_route_and_only_those() -> None:
    served = set()
    for router in API_ROUTERS:
        for route in router.routes:
            for method in getattr(route, "methods", ()):
                if method != "HEAD":
                    served.add(f"{method} {route.path}")  # type: ignore[attr-defined]
    listed = {f"{r.method} {_PLACEHOLDER.sub('{}', r.path)}" for r in ROUTES}
    assert {_PLACEHOLDER.sub("{}", op) for op in served} == listed
    assert len(listed) == len(ROUTES), "a route is listed twice"
    for route in ROUTES:
        assert set(route.expect) == {role for role, _ in SUBJECTS}, route.path


def test_every_api_route_declares_its_access() -> None:
    undeclared = [
        f"{sorted(route.methods)} {route.path}"  # type: ignore[attr-defined]
        for router in API_ROUTERS
        for route in router.routes
        if access_of(route) is None
    ]
    assert undeclared == []


class World:
    """Workspaces A and B, reseeded whenever a request may have changed them. A is fresh for
    every test; B, which only a request that should have been refused could change, lives as
    long as the module's server (`other_tenant`) and is reseeded when such a request was not."""

    def __init__(self, server: RunningServer, other: list[Tenant]) -> None:
        self.server = server
        self.a = Tenant()
        self._other = other

    @property
    def b(self) -> Tenant:
        return self._other[0]

    async def reseed(self, *, both: bool = False) -> None:
        """A fresh workspace A (and with `both`, a fresh B)."""
        svc = self.server.services
        old = self.a
        self.a = await seed_tenant(svc.store, svc.secret, svc.auth.csrf_token, svc.clock(), "a")
        if old.objects:
            await drop_tenant(svc.store, old)
        if both:
            old_b = self.b
            self._other[0] = await seed_tenant(
                svc.store, svc.secret, svc.auth.csrf_token, svc.clock(), "b"
            )
            await drop_tenant(svc.store, old_b)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def other_tenant(matrix_server: RunningServer) -> AsyncIterator[list[Tenant]]:
    """Workspace B for the module's tests (a list of one, so that a reseed replaces it)."""
    svc = matrix_server.services
    other = [await seed_tenant(svc.store, svc.secret, svc.auth.csrf_token, svc.clock(), "b")]
    yield other
    await drop_tenant(svc.store, other[0])


@pytest_asyncio.fixture(loop_scope="module")
async def world(matrix_server: RunningServer, other_tenant: list[Tenant]) -> AsyncIterator[World]:
    made = World(matrix_server, other_tenant)
    await made.reseed()
    yield made
    await drop_tenant(matrix_server.services.store, made.a)


def _fill(value: Any, objects: dict[str, str]) -> Any:
    if isinstance(value, str):
        return _PLACEHOLDER.sub(
            lambda m: uuid.uuid4().hex[:12] if m[1] == "unique" else objects[m[1]], value
        )
    if isinstance(value, dict):
        return {k: _fill(v, objects) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, objects) for v in value]
    return value


async def attempt(
    http: aiohttp.ClientSession,
    base: str,
    route: Route,
    subject: Tenant,
    role: str | None,
    via: str,
    target: Tenant,
) -> int:
    """Call the route as `role` of `subject`'s workspace on `target`'s objects; the status."""
    headers = {}
    if role is not None:
        creds = subject.subjects[role]
        if via == "key":
            headers["Authorization"] = f"Bearer {creds.api_key}"
        else:
            headers["Cookie"] = f"bullpen_session={creds.session_id}"
            if route.method in UNSAFE:
                headers["X-CSRF-Token"] = str(creds.csrf)
                headers["Sec-Fetch-Site"] = "same-origin"
    url = base + _fill(route.path, target.objects)
    body = _fill(route.body, target.objects) if route.body is not None else None
    async with http.request(route.method, url, json=body, headers=headers) as resp:
        if resp.headers.get("Content-Type", "").startswith("text/event-stream"):
            return resp.status  # a live stream: the status is the answer
        raw = await resp.read()
        if resp.status >= 400:
            assert resp.headers["Content-Type"] == "application/problem+json", raw
        if resp.status in (403, 404) and target is not subject:
            problem = json.loads(raw)
            problem.pop("instance", None)  # echoes the path the caller sent
            seen = json.dumps(problem)
            for name in ("task", "agent", "workspace", "key", "run"):
                assert target.objects[name] not in seen, "another workspace's data"
        return resp.status


async def _denials(server: RunningServer) -> int:
    async with server.services.store.read() as conn:
        query = sa.select(sa.func.count()).where(audit_events.c.action == "access.denied")
        return int((await conn.execute(query)).scalar_one())


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("route", ROUTES, ids=lambda r: f"{r.method} {r.path}")
async def test_route_matches_the_matrix(
    route: Route, world: World, matrix_server: RunningServer, matrix_http: aiohttp.ClientSession
) -> None:
    server, http = matrix_server, matrix_http
    mismatches: list[str] = []
    base = server.base_url
    # The fingerprint taken after the last request, while no request or reseed has come since:
    # the next refused request's `before` (nothing else writes: the server runs no worker).
    # Half of the fingerprints, each a read of every table, were this one taken again.
    current: str | None = None

    async def check(role: str | None, via: str, target: Tenant, expected: int) -> None:
        nonlocal current
        refused = expected >= 400
        before = (current or await fingerprint(server.services.store)) if refused else ""
        current = None
        denials = await _denials(server) if expected == 403 else 0
        status = await attempt(http, base, route, world.a, role, via, target)
        who = f"{role or 'anonymous'} via {via}"
        where = "own" if target is world.a else "other workspace's"
        if status != expected:
            mismatches.append(f"{who} on {where} object: {status}, expected {expected}")
        if refused and status >= 400:
            current = await fingerprint(server.services.store)
            if current != before:
                mismatches.append(f"{who}: refused but the data changed")
        if expected == status == 403 and await _denials(server) != denials + 1:
            mismatches.append(f"{who}: 403 not audited")
        if status < 300 and route.method in UNSAFE:
            current = None
            # It changed something: start the next subject afresh (B too if it was B's).
            await world.reseed(both=target is world.b)

    await check(None, "none", world.a, 401)
    for role, via in SUBJECTS:
        await check(role, via, world.a, route.expect[role])
        if route.names_an_object:
            await check(role, via, world.b, route.cross_expect(role))
    assert mismatches == [], "\n".join(mismatches)
