"""Signing in as a browser does: the sign-in page's cookies and hidden fields, the form posted
back, the session cookie, and a member to sign in as."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from http.cookies import Morsel
from uuid import UUID

import aiohttp

from bullpen.api.deps import SESSION_COOKIE
from bullpen.domain.principal import Role
from bullpen.services.auth import hash_password
from bullpen.store import identity
from tests.support.servers import RunningServer

SAME_ORIGIN = {"Sec-Fetch-Site": "same-origin"}


HIDDEN = re.compile(r'<input type="hidden" name="([^"]+)" value="([^"]*)"')


def with_session(session_id: str, **headers: str) -> dict[str, str]:
    """Request headers that carry this session cookie (and any others given)."""
    return {"Cookie": f"{SESSION_COOKIE}={session_id}", **headers}


@dataclass(frozen=True)
class LoginForm:
    """What the sign-in page hands a browser: the cookies it sets and the form's hidden fields."""

    cookies: dict[str, str]
    hidden: dict[str, str]

    def cookie_header(self, sent: str | None) -> dict[str, str]:
        """A `Cookie` header with the page's cookies after those a test sends itself."""
        pairs = [sent] if sent else []
        pairs += [f"{name}={value}" for name, value in self.cookies.items()]
        return {"Cookie": "; ".join(pairs)} if pairs else {}


async def login_form(client: aiohttp.ClientSession, server: RunningServer) -> LoginForm:
    """Open the sign-in page as a browser would before submitting it."""
    async with client.get(f"{server.base_url}/login", headers=SAME_ORIGIN) as resp:
        assert resp.status == 200
        html = await resp.text()
        cookies = {name: morsel.value for name, morsel in resp.cookies.items()}
    return LoginForm(cookies, dict(HIDDEN.findall(html)))


async def post_login(
    client: aiohttp.ClientSession,
    server: RunningServer,
    email: str,
    password: str,
    headers: dict[str, str] | None = None,
    form: LoginForm | None = None,
) -> tuple[aiohttp.ClientResponse, str]:
    """Submit the sign-in form as the page would (opened first, unless `form` is given: one
    browser's page, reused); returns the response and its HTML."""
    form = form or await login_form(client, server)
    sent = {**SAME_ORIGIN, **(headers or {})}
    sent.update(form.cookie_header(sent.pop("Cookie", None)))
    async with client.post(
        f"{server.base_url}/login",
        data={**form.hidden, "email": email, "password": password},
        headers=sent,
        allow_redirects=False,
    ) as resp:
        return resp, await resp.text()


def session_cookie(resp: aiohttp.ClientResponse) -> Morsel[str]:
    """The session cookie a response sets (fails the test if it sets none)."""
    assert SESSION_COOKIE in resp.cookies, resp.headers.getall("Set-Cookie", [])
    return resp.cookies[SESSION_COOKIE]


async def sign_in(
    client: aiohttp.ClientSession,
    server: RunningServer,
    email: str | None = None,
    password: str | None = None,
    headers: dict[str, str] | None = None,
) -> str:
    """Sign in (the bootstrap admin by default); returns the new session id."""
    resp, _ = await post_login(
        client,
        server,
        email or server.boot.email,
        password or server.boot.password or "",
        headers,
    )
    assert resp.status == 303, resp.status
    assert resp.headers["Location"] == "/"
    return session_cookie(resp).value


async def api_status(client: aiohttp.ClientSession, server: RunningServer, session_id: str) -> int:
    """The status `GET /api/v1/tasks` answers with this session cookie."""
    async with client.get(
        f"{server.base_url}/api/v1/tasks", headers=with_session(session_id)
    ) as resp:
        if resp.status == 401:
            assert resp.headers["Content-Type"] == "application/problem+json"
        return resp.status


async def dashboard_status(
    client: aiohttp.ClientSession, server: RunningServer, session_id: str
) -> tuple[int, str | None]:
    """The status and redirect target of `GET /` with this session cookie."""
    async with client.get(
        f"{server.base_url}/", headers=with_session(session_id), allow_redirects=False
    ) as resp:
        return resp.status, resp.headers.get("Location")


async def is_live(client: aiohttp.ClientSession, server: RunningServer, session_id: str) -> bool:
    """Whether both the API and the UI accept this session (and agree about it)."""
    api = await api_status(client, server, session_id)
    page = await dashboard_status(client, server, session_id)
    if api == 200:
        assert page == (200, None)
        return True
    assert api == 401
    assert page == (303, "/login")
    return False


async def add_user(
    server: RunningServer,
    email: str,
    password: str,
    role: Role = Role.MEMBER,
    password_hash: str | None = None,
) -> UUID:
    """A member of the bootstrap workspace (with `role`) who can sign in with `password`
    (stored as `password_hash` when given)."""
    password_hash = password_hash or await asyncio.to_thread(hash_password, password)
    now = server.services.clock()
    async with server.services.store.write() as conn:
        user_id = await identity.create_user(
            conn,
            email=email,
            name=email,
            password_hash=password_hash,
            is_instance_admin=False,
            now=now,
        )
        await identity.add_member(
            conn, workspace_id=server.boot.workspace_id, user_id=user_id, role=role, now=now
        )
    return user_id
