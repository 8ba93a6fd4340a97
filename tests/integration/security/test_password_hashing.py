"""SE-3, the stored form of passwords: argon2id at or above OWASP's floor, and a hash made at
an older (or weaker) cost replaced by one at the configured cost when its owner next signs in.
Over a real socket, both backends (the rehash is a write)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from argon2 import PasswordHasher, Type, extract_parameters

from bullpen.store import identity
from tests.support.login import add_user, post_login
from tests.support.servers import RunningServer

PASSWORD = "correct horse battery staple"
# OWASP's Password Storage Cheat Sheet: argon2id at one of these (memory KiB, iterations)
# pairs, parallelism 1, is its minimum; more memory or iterations is above it.
OWASP_FLOOR = [(47_104, 1), (19_456, 2), (12_288, 3), (9_216, 4), (7_168, 5)]
# Hashes an older release (or another tool) could have stored: valid, but not what we want.
OUTDATED = {
    "weak.id@example.com": PasswordHasher(memory_cost=1024, time_cost=1, parallelism=1),
    "argon2i@example.com": PasswordHasher(type=Type.I),
    "rfc9106@example.com": PasswordHasher(memory_cost=64 * 1024, time_cost=3, parallelism=4),
}


def at_or_above_floor(stored: str) -> bool:
    """Whether a stored hash is argon2id at or above OWASP's floor."""
    params = extract_parameters(stored)
    return params.type is Type.ID and any(
        params.memory_cost >= memory and params.time_cost >= iterations
        for memory, iterations in OWASP_FLOOR
    )


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    """An HTTP client without a cookie jar."""
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as session:
        yield session


async def stored_hash(server: RunningServer, email: str) -> str:
    """The user's password hash as stored."""
    async with server.services.store.read() as conn:
        user = await identity.find_user_for_login(conn, email)
    assert user is not None
    return str(user.password_hash)


async def test_outdated_hashes_are_replaced_at_the_next_sign_in(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    settings = server.settings
    for email, hasher in OUTDATED.items():
        await add_user(server, email, PASSWORD, password_hash=hasher.hash(PASSWORD))

    for email in OUTDATED:
        old = await stored_hash(server, email)
        # A wrong password changes nothing: only a proven password is hashed anew.
        assert (await post_login(client, server, email, PASSWORD + "!"))[0].status == 401
        assert await stored_hash(server, email) == old

        assert (await post_login(client, server, email, PASSWORD))[0].status == 303
        new = await stored_hash(server, email)
        assert new != old, email
        params = extract_parameters(new)
        assert params.type is Type.ID
        assert (params.memory_cost, params.time_cost, params.parallelism) == (
            settings.password_hash_memory_kib,
            settings.password_hash_time_cost,
            settings.password_hash_parallelism,
        )
        assert at_or_above_floor(new), new

        # The new hash is the password's, and is kept: a current hash is not redone.
        assert (await post_login(client, server, email, PASSWORD))[0].status == 303
        assert await stored_hash(server, email) == new

    # The first admin's hash (made at the default cost) is already current, and above the floor.
    admin = await stored_hash(server, server.boot.email)
    assert at_or_above_floor(admin)
    assert (await post_login(client, server, server.boot.email, server.boot.password or ""))[
        0
    ].status == 303
    assert await stored_hash(server, server.boot.email) == admin


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.with_settings(password_hash_memory_kib=47_104, password_hash_time_cost=1)
async def test_the_configured_cost_applies_to_new_and_rehashed_passwords(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    # The first admin's hash was made at the default cost: its next sign-in moves it over.
    assert extract_parameters(await stored_hash(server, server.boot.email)).memory_cost != 47_104
    assert (await post_login(client, server, server.boot.email, server.boot.password or ""))[
        0
    ].status == 303
    params = extract_parameters(await stored_hash(server, server.boot.email))
    assert (params.type, params.memory_cost, params.time_cost) == (Type.ID, 47_104, 1)
