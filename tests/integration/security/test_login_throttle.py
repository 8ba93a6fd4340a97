"""AZ-7, brute force and enumeration, against the sign-in form over a real socket.

SQLite only: the failure windows live in the process, not the store, and the one lookup the
store does for a sign-in runs on both backends in test_sessions.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections import Counter
from collections.abc import AsyncIterator

import aiohttp
import pytest

from bullpen.api.deps import SESSION_COOKIE
from tests.support.login import LoginForm, login_form, post_login
from tests.support.servers import RunningServer

pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)

UNKNOWN = "nobody@example.com"
WRONG = "not-the-password"
MAX_GAP_MS = 25.0


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    """An HTTP client without a cookie jar."""
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as session:
        yield session


async def attempt(
    client: aiohttp.ClientSession,
    server: RunningServer,
    email: str,
    password: str = WRONG,
    via: str | None = None,
    form: LoginForm | None = None,
) -> tuple[int, str, str | None]:
    """One sign-in (from client address `via`); returns status, HTML and Retry-After."""
    # uvicorn takes X-Forwarded-For from 127.0.0.1 as a reverse proxy's word for the client.
    headers = {"X-Forwarded-For": via} if via else None
    resp, html = await post_login(client, server, email, password, headers, form)
    if resp.status != 303:
        assert SESSION_COOKIE not in resp.cookies
    return resp.status, html, resp.headers.get("Retry-After")


def assert_refused_for_now(
    status: int, html: str, retry_after: str | None, window_s: float
) -> None:
    """429 on the sign-in page itself, saying what happened and for how long."""
    assert status == 429
    assert retry_after is not None and 0 < int(retry_after) <= window_s
    assert 'action="/login"' in html
    assert "Too many failed attempts. Try again in 15 minutes." in html


async def test_fifty_bad_sign_ins_known_and_unknown_look_the_same(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    limit = server.settings.login_max_failures
    assert limit == 5  # the documented default
    form = await login_form(client, server)  # one browser, so one form token throughout
    known = [await attempt(client, server, server.boot.email, form=form) for _ in range(50)]
    unknown = [await attempt(client, server, UNKNOWN, form=form) for _ in range(50)]

    for status, html, retry_after in known[:limit]:
        assert (status, retry_after) == (401, None)
        assert "Wrong email or password." in html
    for status, html, retry_after in known[limit:]:
        assert_refused_for_now(status, html, retry_after, server.settings.login_window_s)
    # Whether the account exists changes nothing a client sees: status and bytes alike.
    assert [(s, h) for s, h, _ in unknown] == [(s, h) for s, h, _ in known]
    assert [r is None for *_, r in unknown] == [r is None for *_, r in known]
    # Nor what the server spends: an unknown email is checked against a dummy hash of the same
    # cost, and neither is checked at all once refused.
    assert server.services.auth.passwords.verified == 2 * limit

    # Locked means locked: the right password does not get through now either.
    status, html, retry_after = await attempt(
        client, server, server.boot.email, server.boot.password or ""
    )
    assert_refused_for_now(status, html, retry_after, server.settings.login_window_s)


async def test_concurrent_wrong_passwords_get_no_more_verifies_than_the_limit(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    """Finding 1: the limit held only for attempts that came after a failure was recorded, so
    a burst that arrived together was verified whole (40 of 40 got 401, none 429)."""
    limit, burst = server.settings.login_max_failures, 100
    form = await login_form(client, server)  # one browser's page, submitted 100 times at once
    results = await asyncio.gather(
        *(attempt(client, server, server.boot.email, form=form) for _ in range(burst))
    )

    assert Counter(status for status, *_ in results) == {401: limit, 429: burst - limit}
    for status, html, retry_after in results:
        if status == 429:
            assert_refused_for_now(status, html, retry_after, server.settings.login_window_s)
    # Refused attempts cost no argon2 at all: only the `limit` admitted ones were verified.
    assert server.services.auth.passwords.verified == limit
    # And the account stays locked for the right password too.
    status, *_ = await attempt(client, server, server.boot.email, server.boot.password or "")
    assert status == 429


@pytest.mark.with_settings(login_max_failures=3)
async def test_right_password_among_concurrent_guesses_is_refused_once_the_limit_is_taken(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    """The issue's case: the right password as the 30th of 30 concurrent guesses signed in.

    The 29 wrong guesses go first; once every admitted slot is held (some answered 429), the
    right password comes while their verifies may still run, and must be refused as well.
    """
    limit, email = server.settings.login_max_failures, server.boot.email
    form = await login_form(client, server)
    guesses = [asyncio.ensure_future(attempt(client, server, email, form=form)) for _ in range(29)]
    # A 429 is only given once `limit` attempts are counted, so it marks the moment.
    for done in asyncio.as_completed(guesses):
        if (await done)[0] == 429:
            break
    right = await attempt(client, server, email, server.boot.password or "", form=form)
    results = [*(await asyncio.gather(*guesses)), right]

    assert right[0] == 429
    assert Counter(status for status, *_ in results) == {401: limit, 429: 30 - limit}


@pytest.mark.with_settings(login_max_failures=2)
async def test_threshold_comes_from_settings_and_success_resets_it(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    email, password = server.boot.email, server.boot.password or ""
    assert (await attempt(client, server, email))[0] == 401
    assert (await attempt(client, server, email, password))[0] == 303
    # Without the reset the second of these would already be refused (1 + 1 = 2).
    assert (await attempt(client, server, email))[0] == 401
    assert (await attempt(client, server, email))[0] == 401
    status, html, retry_after = await attempt(client, server, email, password)
    assert_refused_for_now(status, html, retry_after, server.settings.login_window_s)


@pytest.mark.with_settings(login_max_failures_per_client=3)
async def test_one_client_spraying_many_emails_is_stopped(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    sprayer, bystander = "203.0.113.7", "198.51.100.9"
    for name in ("ann", "bob", "cyd"):
        assert (await attempt(client, server, f"{name}@example.com", via=sprayer))[0] == 401
    # A fresh email (zero failures of its own) and even the right password: the client is out.
    status, html, retry_after = await attempt(client, server, "dee@example.com", via=sprayer)
    assert_refused_for_now(status, html, retry_after, server.settings.login_window_s)
    status, *_ = await attempt(
        client, server, server.boot.email, server.boot.password or "", via=sprayer
    )
    assert status == 429
    # Per client, not global: someone else still gets a real answer.
    assert (await attempt(client, server, "dee@example.com", via=bystander))[0] == 401
    assert (
        await attempt(client, server, server.boot.email, server.boot.password or "", via=bystander)
    )[0] == 303


@pytest.mark.with_settings(login_max_failures=1000)
async def test_unknown_email_costs_the_same_time_as_a_wrong_password(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    async def timed(email: str) -> tuple[float, float]:
        """(wall ms, CPU ms) of one failed sign-in; the server runs in this process."""
        wall, cpu = time.perf_counter(), time.process_time()
        status, *_ = await attempt(client, server, email)
        assert status == 401
        return (time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000

    await timed(server.boot.email)  # warm-up: first-use costs out of the way
    await timed(UNKNOWN)
    known: list[tuple[float, float]] = []
    unknown: list[tuple[float, float]] = []
    for i in range(10):  # adjacent pairs, alternating order, so load drift hits both alike
        first, second = (known, unknown) if i % 2 else (unknown, known)
        first.append(await timed(server.boot.email if first is known else UNKNOWN))
        second.append(await timed(server.boot.email if second is known else UNKNOWN))

    # TEST-PLAN's target is a 5 ms median gap, marked (p): tunable. An argon2id verify
    # (~0.1-0.5 s here) dominates both paths, so a path that skipped it for unknown emails
    # would be off by the whole verify. CPU time (process-wide, so argon2's own threads count)
    # is what the two paths spend, and other tenants of a shared box barely move it: 25 ms.
    cpu_gap = statistics.median(c for _, c in known) - statistics.median(c for _, c in unknown)
    assert abs(cpu_gap) < MAX_GAP_MS, (known, unknown)
    # What a client sees: wall time, paired. On a loaded 2-core box one request jitters by
    # 100 ms and more, so the bound widens to what ten pairs can resolve (3 robust standard
    # errors of the median); on a quiet one it is the same 25 ms.
    diffs = [k - u for (k, _), (u, _) in zip(known, unknown, strict=True)]
    wall_gap = statistics.median(diffs)
    spread = 1.4826 * statistics.median(abs(d - wall_gap) for d in diffs)
    resolvable = 3 * 1.253 * spread / math.sqrt(len(diffs))
    assert abs(wall_gap) < max(MAX_GAP_MS, resolvable), (wall_gap, resolvable, known, unknown)
