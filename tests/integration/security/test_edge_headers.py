"""What every answer carries, and who may read /metrics and /docs (issue 19, finding 9).

A real server on a loopback socket. "Over https" is a request from a trusted proxy (uvicorn
believes X-Forwarded-Proto from 127.0.0.1, `BULLPEN_FORWARDED_ALLOW_IPS`), as in production
behind a TLS-terminating proxy.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from uuid import UUID

import aiohttp
import pytest
import sqlalchemy as sa

from bullpen.api.deps import SECURE_SESSION_COOKIE, SESSION_COOKIE
from bullpen.domain.principal import Role
from bullpen.store.tables import users
from tests.support.http import bearer
from tests.support.login import post_login
from tests.support.seed import new_member, open_session
from tests.support.servers import RunningServer

HTTPS = {"X-Forwarded-Proto": "https"}
SAME_ORIGIN = {"Sec-Fetch-Site": "same-origin"}
METRICS_TOKEN = "m" * 32
SECURITY = ("X-Content-Type-Options", "X-Frame-Options", "Content-Security-Policy")


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    """An HTTP client without a cookie jar: cookies go only where a test puts them."""
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as session:
        yield session


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_413_carries_the_security_headers(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    big = b"x" * (server.settings.max_body_bytes + 1)
    headers = {**server.auth, "Content-Type": "application/json"}
    async with client.post(f"{server.base_url}/api/v1/tasks", data=big, headers=headers) as resp:
        assert resp.status == 413
        for name in SECURITY:
            assert name in resp.headers, name
        assert resp.headers["Cache-Control"] == "no-store"


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_authenticated_answers_are_not_stored_static_assets_may_be(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    for path in ("/api/v1/tasks", "/api/v1/users/me", "/nonexistent"):
        async with client.get(server.base_url + path, headers=server.auth) as resp:
            assert resp.headers.get("Cache-Control") == "no-store", path
    cookie = {"Cookie": f"{SESSION_COOKIE}={await open_session(server, await _admin(server))}"}
    async with client.get(f"{server.base_url}/", headers=cookie) as resp:
        assert resp.status == 200
        assert resp.headers.get("Cache-Control") == "no-store"
    async with client.get(f"{server.base_url}/static/style.css") as resp:
        assert resp.status == 200
        assert "no-store" not in resp.headers.get("Cache-Control", "")


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_the_relays_direct_answers_carry_them_too(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    """The relay is served ahead of the middleware stack (`bullpen.api.direct`)."""
    headers = {**server.auth, **HTTPS, "Content-Type": "application/json"}
    async with client.post(
        f"{server.base_url}/v1/chat/completions", data=b"{}", headers=headers
    ) as resp:
        assert resp.status == 422
        assert resp.headers["Cache-Control"] == "no-store"
        assert resp.headers["Strict-Transport-Security"] == "max-age=31536000"
        assert "Content-Security-Policy" in resp.headers


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_hsts_over_https_only(server: RunningServer, client: aiohttp.ClientSession) -> None:
    for path in ("/healthz", "/login", "/static/style.css", "/nonexistent"):
        async with client.get(server.base_url + path, headers=HTTPS) as resp:
            assert resp.headers.get("Strict-Transport-Security") == "max-age=31536000", path
        async with client.get(server.base_url + path) as resp:
            assert "Strict-Transport-Security" not in resp.headers, path


async def test_over_https_the_session_cookie_is_host_prefixed(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    resp, _ = await post_login(
        client, server, server.boot.email, server.boot.password or "", headers=HTTPS
    )
    assert resp.status == 303
    set_cookie = resp.headers.getall("Set-Cookie")
    assert len(set_cookie) == 1, set_cookie
    assert set_cookie[0].startswith(SECURE_SESSION_COOKIE + "="), set_cookie
    attributes = [a.strip().lower() for a in set_cookie[0].split(";")[1:]]
    assert "secure" in attributes and "path=/" in attributes and "httponly" in attributes
    assert not any(a.startswith("domain") for a in attributes)
    session = set_cookie[0].split(";", 1)[0].split("=", 1)[1]

    # Over https only the prefixed name is read; over http only the bare one.
    for name, headers, expected in (
        (SECURE_SESSION_COOKIE, HTTPS, 200),
        (SESSION_COOKIE, HTTPS, 401),
        (SESSION_COOKIE, {}, 200),
        (SECURE_SESSION_COOKIE, {}, 401),
    ):
        cookie = {"Cookie": f"{name}={session}", **headers}
        async with client.get(f"{server.base_url}/api/v1/tasks", headers=cookie) as resp:
            assert resp.status == expected, (name, headers)
        async with client.get(f"{server.base_url}/", headers=cookie, allow_redirects=False) as resp:
            assert resp.status == (200 if expected == 200 else 303), (name, headers)

    # Signing out over https clears the prefixed cookie (with Secure, or browsers ignore it).
    csrf = server.services.auth.csrf_token(session)
    async with client.post(
        f"{server.base_url}/logout",
        data={"csrf": csrf},
        headers={"Cookie": f"{SECURE_SESSION_COOKIE}={session}", **SAME_ORIGIN, **HTTPS},
        allow_redirects=False,
    ) as resp:
        assert resp.status == 303
        cleared = [
            c for c in resp.headers.getall("Set-Cookie") if c.startswith(SECURE_SESSION_COOKIE)
        ]
    assert len(cleared) == 1 and "secure" in cleared[0].lower()
    async with client.get(
        f"{server.base_url}/api/v1/tasks",
        headers={"Cookie": f"{SECURE_SESSION_COOKIE}={session}", **HTTPS},
    ) as resp:
        assert resp.status == 401


async def metrics_answer(
    http: aiohttp.ClientSession, server: RunningServer, headers: dict[str, str]
) -> tuple[int, str]:
    """GET /metrics: the status and the body (a problem+json's type, or the metrics)."""
    async with http.get(f"{server.base_url}/metrics", headers=headers) as resp:
        text = await resp.text()
        if resp.status >= 400:
            assert resp.headers["Content-Type"] == "application/problem+json"
            assert "Traceback" not in text
        return resp.status, text


@pytest.mark.with_settings(metrics_token=METRICS_TOKEN)
async def test_metrics_need_an_instance_admin_or_the_metrics_token(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    owner = await new_member(server, Role.OWNER, "owner@x.io")  # a workspace owner, not instance
    for headers, expected in (
        ({}, 401),
        (bearer("m" * 31), 401),
        (bearer(METRICS_TOKEN + "m"), 401),
        (bearer(owner.key), 403),
    ):
        status, _ = await metrics_answer(http, server, headers)
        assert status == expected, headers
    for headers in (server.auth, bearer(METRICS_TOKEN)):
        status, text = await metrics_answer(http, server, headers)
        assert status == 200 and "process_resident_memory_bytes" in text


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_metrics_without_a_token_setting_take_no_token(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    assert server.settings.metrics_token is None
    for headers in ({}, bearer(""), bearer("m" * 32)):
        status, _ = await metrics_answer(http, server, headers)
        assert status == 401, headers


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_docs_are_served_from_this_origin(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    async with client.get(f"{server.base_url}/docs") as resp:
        assert resp.status == 200
        html = await resp.text()
    sources = re.findall(r'(?:src|href)="([^"]+)"', html)
    sources = [s for s in sources if s != "data:,"]  # the empty favicon
    assert sources and all(s.startswith("/static/") for s in sources), sources
    assert "<script>" not in html  # no inline script: the CSP would refuse it
    for source in sources:
        async with client.get(server.base_url + source) as resp:
            assert resp.status == 200, source
            assert len(await resp.read()) > 100, source
    async with client.get(f"{server.base_url}/redoc") as resp:
        assert resp.status == 404  # FastAPI's CDN page is gone


async def _admin(server: RunningServer) -> UUID:
    """The bootstrap admin's user id."""
    async with server.services.store.read() as conn:
        user_id: UUID = (await conn.execute(sa.select(users.c.id))).scalar_one()
    return user_id
