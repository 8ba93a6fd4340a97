"""AZ-4, session lifecycle, over a real socket on both backends.

The client keeps no cookies and follows no redirects: each request carries exactly the
session cookie the test hands it, the way a browser (or an attacker holding a copy) would.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
import sqlalchemy as sa

from bullpen.api.deps import SECURE_SESSION_COOKIE, SESSION_COOKIE
from bullpen.store import identity
from bullpen.store.tables import audit_events, users
from tests.support.login import (
    SAME_ORIGIN,
    add_user,
    api_status,
    dashboard_status,
    is_live,
    post_login,
    session_cookie,
    sign_in,
    with_session,
)
from tests.support.servers import RunningServer

PASSWORD = "correct horse battery staple"


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    """An HTTP client without a cookie jar: cookies go only where a test puts them."""
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as session:
        yield session


async def test_every_sign_in_gets_a_new_session_and_ends_the_old_one(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    # A cookie planted before sign-in (session fixation) is not adopted.
    planted = "attacker-chosen-session-id"
    first = await sign_in(client, server, headers=with_session(planted))
    assert first != planted
    assert await is_live(client, server, first)

    # Signing in again from the same browser: a new id, and the old one is over.
    second = await sign_in(client, server, headers=with_session(first))
    assert second not in (first, planted)
    assert await is_live(client, server, second)
    assert not await is_live(client, server, first)


async def test_signed_out_cookie_is_dead(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    session_id = await sign_in(client, server)
    assert await is_live(client, server, session_id)
    csrf = server.services.auth.csrf_token(session_id)

    async with client.post(
        f"{server.base_url}/logout",
        data={"csrf": csrf},
        headers=with_session(session_id, **SAME_ORIGIN),
        allow_redirects=False,
    ) as resp:
        assert resp.status == 303
        assert resp.headers["Location"] == "/login"
        cleared = session_cookie(resp)
        assert cleared.value == ""
        assert cleared["max-age"] == "0"

    # A copy of the cookie kept from before is refused everywhere.
    assert await api_status(client, server, session_id) == 401
    assert await dashboard_status(client, server, session_id) == (303, "/login")


async def test_disabling_a_user_ends_all_their_sessions(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    email = "casey@example.com"
    user_id = await add_user(server, email, PASSWORD)
    laptop = await sign_in(client, server, email, PASSWORD)
    phone = await sign_in(client, server, email, PASSWORD)
    assert laptop != phone
    assert await is_live(client, server, laptop)
    assert await is_live(client, server, phone)

    disable = sa.update(users).where(users.c.id == user_id)
    async with server.services.store.write() as conn:
        await conn.execute(disable.values(disabled_at=server.services.clock()))

    assert not await is_live(client, server, laptop)
    assert not await is_live(client, server, phone)
    # Nor can they open a new one; the refusal reads like any wrong password.
    resp, html = await post_login(client, server, email, PASSWORD)
    assert resp.status == 401
    assert SESSION_COOKIE not in resp.cookies
    assert "Wrong email or password." in html
    # Control: other people's credentials still work.
    async with client.get(f"{server.base_url}/api/v1/tasks", headers=server.auth) as resp:
        assert resp.status == 200


# The cookie is built the same way whatever the store is.
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_session_cookie_attributes(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    resp, _ = await post_login(client, server, server.boot.email, server.boot.password or "")
    assert resp.status == 303
    cookie = session_cookie(resp)
    assert cookie["httponly"] is True
    assert cookie["samesite"].lower() == "lax"
    assert cookie["path"] == "/"
    assert int(cookie["max-age"]) == int(server.settings.session_ttl_s)
    assert not cookie["secure"]  # plain http: a Secure cookie would never come back

    # Behind a TLS-terminating proxy. uvicorn trusts X-Forwarded-Proto from 127.0.0.1 (its
    # default `forwarded_allow_ips`), so the app sees `https` exactly as it would in production.
    resp, _ = await post_login(
        client,
        server,
        server.boot.email,
        server.boot.password or "",
        headers={"X-Forwarded-Proto": "https"},
    )
    assert resp.status == 303
    # `__Host-` prefixed: browsers take it only Secure, with Path=/ and no Domain.
    assert SESSION_COOKIE not in resp.cookies
    cookie = resp.cookies[SECURE_SESSION_COOKIE]
    assert cookie["secure"] is True
    assert (cookie["path"], cookie["domain"]) == ("/", "")


async def test_password_change_ends_every_session(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    email, old = server.boot.email, server.boot.password or ""
    new = "a much longer brand-new secret"
    here = await sign_in(client, server, email, old)
    elsewhere = await sign_in(client, server, email, old)
    csrf = server.services.auth.csrf_token(here)

    async def change(current: str, new_password: str, confirm: str) -> tuple[int, str, str]:
        form = {"csrf": csrf, "current_password": current, "new_password": new_password}
        async with client.post(
            f"{server.base_url}/ui/account/password",
            data={**form, "confirm": confirm},
            headers=with_session(here, **SAME_ORIGIN),
            allow_redirects=False,
        ) as resp:
            return resp.status, resp.headers.get("Location", ""), await resp.text()

    # Refusals re-show the form with the reason and change nothing.
    assert (await change(old, "too short", "too short"))[:2] == (422, "")
    assert (await change(old, new, new + "!"))[:2] == (422, "")
    status, _, html = await change(old + "!", new, new)
    assert status == 403
    assert "The current password is wrong." in html
    assert await is_live(client, server, here)
    assert await is_live(client, server, elsewhere)

    status, location, _ = await change(old, new, new)
    assert (status, location) == (303, "/login?done=password")
    assert not await is_live(client, server, here)
    assert not await is_live(client, server, elsewhere)
    resp, html = await post_login(client, server, email, old)
    assert resp.status == 401
    assert await is_live(client, server, await sign_in(client, server, email, new))

    async with server.services.store.read() as conn:
        user = await identity.find_user_for_login(conn, email)
        assert user is not None
        user_id, stored = user.id, user.password_hash
        events = (
            await conn.execute(
                sa.select(audit_events.c.actor_id, audit_events.c.target_id).where(
                    audit_events.c.action == "user.password_change"
                )
            )
        ).all()
    assert stored is not None and stored.startswith("$argon2id$")
    assert [tuple(e) for e in events] == [(user_id, user_id)]
