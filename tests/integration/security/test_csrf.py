"""AZ-5, CSRF, over a real socket on both backends.

A write that rides on the session cookie must carry that session's own CSRF token and must not
come from another site (Fetch Metadata); otherwise 403 and nothing changes. The "foreign" token
is a valid one, but of another session, as an attacker signed in themselves would have.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import aiohttp
import pytest

from bullpen.api.deps import CSRF_HEADER, SESSION_COOKIE
from bullpen.store import identity
from bullpen.store.tables import tasks
from tests.support.db import count
from tests.support.login import (
    HIDDEN,
    SAME_ORIGIN,
    LoginForm,
    is_live,
    login_form,
    post_login,
    session_cookie,
    sign_in,
    with_session,
)
from tests.support.servers import RunningServer

PROMPT = "Summarise the open support tickets for the weekly review."
PROBLEM = "application/problem+json"

# Every way a cookie-carrying write can arrive without proof that this site's page sent it:
# (whose CSRF token, Fetch Metadata headers, what the case is).
CASES: list[tuple[str | None, dict[str, str], str]] = [
    (None, {}, "no token, no Fetch Metadata"),
    (None, SAME_ORIGIN, "no token"),
    ("foreign", SAME_ORIGIN, "another session's token"),
    ("own", {"Sec-Fetch-Site": "cross-site"}, "cross-site"),
    # Another subdomain of the same site is not this origin.
    ("own", {"Sec-Fetch-Site": "same-site"}, "same-site"),
]


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    """An HTTP client without a cookie jar: cookies go only where a test puts them."""
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as session:
        yield session


async def two_sessions(client: aiohttp.ClientSession, server: RunningServer) -> dict[str, str]:
    """The victim's session ("own") and another one ("foreign"), by role."""
    return {"own": await sign_in(client, server), "foreign": await sign_in(client, server)}


def token(server: RunningServer, sessions: dict[str, str], which: str | None) -> str | None:
    """The CSRF token of one of the sessions, or None for no token at all."""
    return None if which is None else server.services.auth.csrf_token(sessions[which])


async def stored_hash(server: RunningServer) -> str:
    """The bootstrap admin's password hash as stored."""
    async with server.services.store.read() as conn:
        user = await identity.find_user_for_login(conn, server.boot.email)
    assert user is not None
    return str(user.password_hash)


async def post_form(
    client: aiohttp.ClientSession,
    server: RunningServer,
    path: str,
    form: dict[str, str],
    session: str,
    csrf: str | None,
    headers: dict[str, str],
) -> aiohttp.ClientResponse:
    """Post a form with the session's cookie, adding `csrf` as its token unless it is None."""
    async with client.post(
        server.base_url + path,
        data=form if csrf is None else {**form, "csrf": csrf},
        headers=with_session(session, **headers),
        allow_redirects=False,
    ) as resp:
        await resp.read()
        return resp


async def assert_forbidden(resp: aiohttp.ClientResponse, case: str) -> None:
    assert resp.status == 403, (case, resp.status, await resp.text())
    assert resp.headers["Content-Type"] == PROBLEM, case
    body = await resp.json(content_type=None)
    assert body["status"] == 403
    assert body["type"].endswith("/forbidden")


async def test_task_form_needs_own_token_and_same_origin(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    sessions = await two_sessions(client, server)
    form = {"prompt": PROMPT, "agent_id": str(server.boot.agent_id)}

    async def submit(csrf: str | None, headers: dict[str, str]) -> aiohttp.ClientResponse:
        return await post_form(client, server, "/ui/tasks", form, sessions["own"], csrf, headers)

    for which, headers, case in CASES:
        await assert_forbidden(await submit(token(server, sessions, which), headers), case)
    assert await count(server, tasks) == 0

    resp = await submit(token(server, sessions, "own"), SAME_ORIGIN)
    assert resp.status == 303
    assert re.fullmatch(r"/tasks/[0-9a-f-]{36}", resp.headers["Location"])
    assert await count(server, tasks) == 1


async def test_sign_out_form_needs_own_token_and_same_origin(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    sessions = await two_sessions(client, server)

    async def submit(csrf: str | None, headers: dict[str, str]) -> aiohttp.ClientResponse:
        return await post_form(client, server, "/logout", {}, sessions["own"], csrf, headers)

    for which, headers, case in CASES:
        resp = await submit(token(server, sessions, which), headers)
        await assert_forbidden(resp, case)
        assert SESSION_COOKIE not in resp.cookies, case  # the cookie is not cleared either
        assert await is_live(client, server, sessions["own"]), case

    resp = await submit(token(server, sessions, "own"), SAME_ORIGIN)
    assert resp.status == 303
    assert resp.headers["Location"] == "/login"
    assert not await is_live(client, server, sessions["own"])
    assert await is_live(client, server, sessions["foreign"])


async def test_cookie_authenticated_api_write_needs_own_token_and_same_origin(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    sessions = await two_sessions(client, server)
    body = {"prompt": PROMPT, "agent_id": str(server.boot.agent_id)}

    async def create(csrf: str | None, headers: dict[str, str]) -> aiohttp.ClientResponse:
        sent = with_session(sessions["own"], **headers)
        if csrf is not None:
            sent[CSRF_HEADER] = csrf
        async with client.post(f"{server.base_url}/api/v1/tasks", json=body, headers=sent) as resp:
            await resp.read()
            return resp

    for which, headers, case in CASES:
        await assert_forbidden(await create(token(server, sessions, which), headers), case)
    assert await count(server, tasks) == 0

    resp = await create(token(server, sessions, "own"), SAME_ORIGIN)
    assert resp.status == 201, await resp.text()
    assert await count(server, tasks) == 1


# The same check as the task form's; the change itself runs on both stores in test_sessions.
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_password_form_needs_own_token_and_same_origin(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    sessions = await two_sessions(client, server)
    new = "a much longer brand-new secret"
    form = {
        "current_password": server.boot.password or "",
        "new_password": new,
        "confirm": new,
    }
    before = await stored_hash(server)

    async def submit(csrf: str | None, headers: dict[str, str]) -> aiohttp.ClientResponse:
        path = "/ui/account/password"
        return await post_form(client, server, path, form, sessions["own"], csrf, headers)

    for which, headers, case in CASES:
        await assert_forbidden(await submit(token(server, sessions, which), headers), case)
        assert await is_live(client, server, sessions["own"]), case
    assert await stored_hash(server) == before

    resp = await submit(token(server, sessions, "own"), SAME_ORIGIN)
    assert resp.status == 303
    assert not await is_live(client, server, sessions["own"])
    assert not await is_live(client, server, sessions["foreign"])


# Fetch Metadata is checked before the password, whatever the store.
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_cross_site_sign_in_is_refused(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    # Login CSRF: another site must not sign this browser into an account of its choosing.
    resp, _ = await post_login(
        client,
        server,
        server.boot.email,
        server.boot.password or "",
        headers={"Sec-Fetch-Site": "cross-site"},
    )
    await assert_forbidden(resp, "cross-site sign-in")
    assert SESSION_COOKIE not in resp.cookies


# The sign-in form is checked before the store is touched, whatever the store.
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_sign_in_form_needs_the_token_of_this_browsers_page(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    """Finding 9: login CSRF relied on Fetch Metadata alone, so a browser that sends none (or a
    request that leaves it out) could be signed into the attacker's account by a forged form.
    The page sets a pre-session cookie and carries the matching token in the form."""
    email, password = server.boot.email, server.boot.password or ""
    mine, theirs = await login_form(client, server), await login_form(client, server)
    forged: list[tuple[LoginForm, dict[str, str], str]] = [
        (LoginForm({}, {}), {}, "no cookie, no token, no Fetch Metadata"),
        (LoginForm({}, {}), SAME_ORIGIN, "no cookie, no token"),
        (LoginForm(mine.cookies, {}), SAME_ORIGIN, "no token"),
        (LoginForm({}, mine.hidden), SAME_ORIGIN, "a token without its cookie"),
        (LoginForm(mine.cookies, theirs.hidden), SAME_ORIGIN, "another page's token"),
        (LoginForm(mine.cookies, {"csrf": "é" * 64}), SAME_ORIGIN, "a non-ASCII token"),
    ]
    fresh: list[LoginForm] = []
    for form, headers, case in forged:
        resp, html = await post_login(client, server, email, password, headers, form)
        assert resp.status == 403, (case, resp.status)
        assert SESSION_COOKIE not in resp.cookies, case
        assert "This sign-in form has expired. Please sign in again." in html, case
        fresh.append(
            LoginForm(
                {name: morsel.value for name, morsel in resp.cookies.items()} or form.cookies,
                dict(HIDDEN.findall(html)),
            )
        )
    assert server.services.auth.passwords.verified == 0  # no password was even checked
    # Each page its own pair: a token is worth nothing without its own browser's cookie.
    assert mine.cookies and mine.hidden.get("csrf")
    assert mine.cookies != theirs.cookies and mine.hidden != theirs.hidden

    # A refusal shows a fresh form (a person just submits again), and the page's own still
    # works: what was refused was the forgery, not this browser.
    for form in (fresh[0], fresh[-1], mine):
        resp, _ = await post_login(client, server, email, password, SAME_ORIGIN, form)
        assert resp.status == 303
        assert session_cookie(resp).value


# Not a token at all: non-ASCII (once a TypeError in the comparison, so a 500), control
# characters, and an over-long one. Each is a plain 403 (or the form's own 422 for its length).
ODD_TOKENS = ["é" * 64, "ü", "\u2603" + "0" * 63, "\x01\x7f", "0" * 129]


async def test_a_non_ascii_csrf_token_is_a_403_for_api_and_form(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    session = await sign_in(client, server)
    body = {"prompt": PROMPT, "agent_id": str(server.boot.agent_id)}
    for odd in ODD_TOKENS:
        if odd.isprintable():  # a client refuses control characters in a header
            headers = with_session(session, **SAME_ORIGIN, **{CSRF_HEADER: odd})
            url = f"{server.base_url}/api/v1/tasks"
            async with client.post(url, json=body, headers=headers) as resp:
                await assert_forbidden(resp, repr(odd))
        resp = await post_form(client, server, "/ui/tasks", body, session, odd, SAME_ORIGIN)
        if resp.status != 422:  # the form's own length bound may answer first
            await assert_forbidden(resp, repr(odd))
    # Bytes that are not UTF-8 at all, percent-encoded in the form.
    raw = f"prompt=x&agent_id={server.boot.agent_id}&csrf=%FF%FE%C3"
    form_type = {"Content-Type": "application/x-www-form-urlencoded"}
    async with client.post(
        server.base_url + "/ui/tasks",
        data=raw,
        headers=with_session(session, **SAME_ORIGIN, **form_type),
        allow_redirects=False,
    ) as resp:
        await assert_forbidden(resp, "not UTF-8")
    assert await count(server, tasks) == 0
    assert await is_live(client, server, session)
