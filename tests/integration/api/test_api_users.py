"""Users over a real socket, on both backends: the caller's account, passwords, admin management.

Argon2 hashing is deliberately slow, so these tests hash as few passwords as they can.
"""

from __future__ import annotations

import asyncio
import functools
import uuid

import aiohttp
import pytest
import sqlalchemy as sa

from bullpen.api.deps import CSRF_HEADER, SESSION_COOKIE
from bullpen.domain.principal import Role
from bullpen.errors import Unauthenticated
from bullpen.services.auth import hash_password
from bullpen.store.tables import audit_events, idempotency_keys, users
from tests.support.db import audits, count
from tests.support.http import bearer, call, problem
from tests.support.seed import agent_key, new_member, open_session
from tests.support.servers import RunningServer

UNKNOWN = "00000000-0000-4000-8000-000000000000"
PASSWORD = "first password 123"
NEW_PASSWORD = "second password 456"


@functools.cache
def password_hash() -> str:
    """PASSWORD's hash, computed once for the whole run (argon2 is slow on purpose)."""
    return hash_password(PASSWORD)


async def test_me_and_instance_admins_manage_users(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    svc = server.services
    member_id, _, member_key = await new_member(server, Role.MEMBER, "member@x.io")
    member = bearer(member_key)

    me = await call(http, server, "GET", "/api/v1/users/me", server.auth)
    assert me.status == 200
    admin_id = me.body["id"]
    assert me.body == {
        "id": admin_id,
        "email": "admin@bullpen.local",
        "name": "Admin",
        "is_instance_admin": True,
        "role": "owner",
        "workspace_id": str(server.boot.workspace_id),
    }
    theirs = await call(http, server, "GET", "/api/v1/users/me", member)
    assert theirs.body["role"] == "member" and theirs.body["is_instance_admin"] is False
    bot_key = await agent_key(server)
    no_user = await call(http, server, "GET", "/api/v1/users/me", bearer(bot_key))
    assert "agent" in problem(no_user, 404)["detail"]
    problem(await call(http, server, "GET", "/api/v1/users/me", {}), 401)

    # Not instance admins: refused (and audited), nothing created.
    create = {"email": "Ada@Example.COM", "name": "Ada Lovelace", "password": PASSWORD}
    users_before = await count(server, users)
    problem(await call(http, server, "GET", "/api/v1/users", member), 403)
    problem(await call(http, server, "POST", "/api/v1/users", member, create), 403)
    problem(await call(http, server, "GET", f"/api/v1/users/{member_id}", member), 403)
    problem(await call(http, server, "PATCH", f"/api/v1/users/{member_id}", member, {}), 403)
    assert await count(server, users) == users_before
    assert await count(server, audit_events, audit_events.c.action == "access.denied") == 4

    idem = {**server.auth, "Idempotency-Key": "user-1"}
    created = await call(http, server, "POST", "/api/v1/users", idem, create)
    assert created.status == 201, created.body
    ada = created.body["id"]
    assert created.headers["Location"] == f"/api/v1/users/{ada}"
    assert created.body == {
        "id": ada,
        "email": "ada@example.com",
        "name": "Ada Lovelace",
        "is_instance_admin": False,
        "disabled": False,
        "disabled_at": None,
        "created_at": created.body["created_at"],
    }
    replay = await call(http, server, "POST", "/api/v1/users", idem, create)
    assert replay.status == 201 and replay.body == created.body
    assert replay.headers["Idempotent-Replayed"] == "true"
    async with svc.store.read() as conn:
        stored = (await conn.execute(sa.select(idempotency_keys.c.body))).scalar_one()
        hashed = (
            await conn.execute(sa.select(users.c.password_hash).where(users.c.id == uuid.UUID(ada)))
        ).scalar_one()
    assert PASSWORD.encode() not in bytes(stored) and b"argon2" not in bytes(stored)
    assert hashed.startswith("$argon2id$") and PASSWORD not in hashed
    (audit,) = await audits(server, "user.create")
    assert audit.data == {
        "email": "ada@example.com",
        "name": "Ada Lovelace",
        "is_instance_admin": False,
    }
    # An instance admin's action: audited at instance level, not in its workspace.
    assert str(audit.target_id) == ada and audit.workspace_id is None

    dup = await call(
        http, server, "POST", "/api/v1/users", server.auth, {**create, "email": "ADA@example.com"}
    )
    problem(dup, 409)
    for bad, field in [
        ({**create, "password": "x" * 11}, "password"),
        ({**create, "password": "x" * 1025}, "password"),
        ({**create, "email": "ada"}, "email"),
        ({**create, "email": "ada@@x.io"}, "email"),
        ({**create, "name": "tab\there"}, "name"),
        ({**create, "name": ""}, "name"),
        ({**create, "is_instance_admin": "true"}, "is_instance_admin"),
        ({**create, "password_hash": "$argon2id$..."}, "password_hash"),
        ({**create, "disabled_at": None}, "disabled_at"),
    ]:
        reply = await call(http, server, "POST", "/api/v1/users", server.auth, bad)
        assert any(e["field"] == field for e in problem(reply, 422)["errors"]), (bad, reply.body)
        assert PASSWORD not in reply.text
    assert await count(server, users) == users_before + 1

    listing = await call(http, server, "GET", "/api/v1/users?limit=2", server.auth)
    assert [u["email"] for u in listing.body["items"]] == ["admin@bullpen.local", "member@x.io"]
    cursor = listing.body["next_cursor"]
    rest = await call(http, server, "GET", f"/api/v1/users?limit=2&cursor={cursor}", server.auth)
    assert [u["id"] for u in rest.body["items"]] == [ada] and rest.body["next_cursor"] is None
    assert "hash" not in listing.text + rest.text and "argon2" not in listing.text + rest.text
    problem(await call(http, server, "GET", "/api/v1/users?limit=0", server.auth), 422)
    got = await call(http, server, "GET", f"/api/v1/users/{ada}", server.auth)
    assert got.status == 200 and got.body == created.body
    problem(await call(http, server, "GET", f"/api/v1/users/{UNKNOWN}", server.auth), 404)
    problem(await call(http, server, "GET", "/api/v1/users/nobody", server.auth), 404)
    patch_me = await call(http, server, "PATCH", "/api/v1/users/me", server.auth, {"name": "x"})
    assert problem(patch_me, 405) and patch_me.headers["Allow"] == "GET, HEAD"

    path = f"/api/v1/users/{ada}"
    renamed = await call(http, server, "PATCH", path, server.auth, {"name": "Ada L."})
    assert renamed.status == 200 and renamed.body["name"] == "Ada L."
    same = await call(http, server, "PATCH", path, server.auth, {"name": "Ada L."})
    assert same.status == 200
    (update,) = await audits(server, "user.update")
    assert update.data == {"before": {"name": "Ada Lovelace"}, "after": {"name": "Ada L."}}
    for bad in (
        {"name": None},
        {"disabled": None},
        {"disabled": "yes"},
        {"email": "new@x.io"},
        {"password": NEW_PASSWORD},
    ):
        problem(await call(http, server, "PATCH", path, server.auth, bad), 422)
    problem(await call(http, server, "PATCH", f"/api/v1/users/{UNKNOWN}", server.auth, {}), 404)
    # An admin can neither disable nor demote itself.
    mine = f"/api/v1/users/{admin_id}"
    problem(await call(http, server, "PATCH", mine, server.auth, {"disabled": True}), 409)
    demote = {"is_instance_admin": False}
    problem(await call(http, server, "PATCH", mine, server.auth, demote), 409)
    assert (await call(http, server, "GET", "/api/v1/users/me", server.auth)).status == 200

    # Disabling ends the user's sessions and stops its keys; enabling lets the keys work again.
    session = await open_session(server, member_id)
    await svc.auth.authenticate_session(session)
    target = f"/api/v1/users/{member_id}"
    off = await call(http, server, "PATCH", target, server.auth, {"disabled": True})
    assert off.status == 200 and off.body["disabled"] is True and off.body["disabled_at"]
    with pytest.raises(Unauthenticated):
        await svc.auth.authenticate_session(session)
    problem(await call(http, server, "GET", "/api/v1/users/me", member), 401)
    disabled = (await audits(server, "user.update"))[-1]
    assert disabled.data == {
        "before": {"disabled": False},
        "after": {"disabled": True},
        "sessions_ended": 1,
    }
    on = await call(http, server, "PATCH", target, server.auth, {"disabled": False})
    assert on.body["disabled"] is False and on.body["disabled_at"] is None
    promoted = await call(http, server, "PATCH", target, server.auth, {"is_instance_admin": True})
    assert promoted.body["is_instance_admin"] is True
    assert (await call(http, server, "GET", "/api/v1/users", member)).status == 200
    assert [a.data["after"] for a in (await audits(server, "user.update"))[-2:]] == [
        {"disabled": False},
        {"is_instance_admin": True},
    ]


async def test_password_change_ends_every_session(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    svc = server.services
    user_id, _, key = await new_member(server, Role.MEMBER, "pat@x.io")
    async with svc.store.write() as conn:
        await conn.execute(
            users.update()
            .where(users.c.id == user_id)
            .values(password_hash=await asyncio.to_thread(password_hash))
        )
    session = await svc.auth.sign_in("pat@x.io", PASSWORD, client="t")
    other_session = await open_session(server, user_id)
    cookie = {
        "Cookie": f"{SESSION_COOKIE}={session}",
        CSRF_HEADER: svc.auth.csrf_token(session),
    }
    assert (await call(http, server, "GET", "/api/v1/users/me", cookie)).status == 200

    url = "/api/v1/users/me/password"
    wrong = {"current_password": "not my password", "new_password": NEW_PASSWORD}
    refused = problem(await call(http, server, "PUT", url, bearer(key), wrong), 403)
    assert "password" in refused["detail"] and NEW_PASSWORD not in str(refused)
    for bad in (
        {"current_password": PASSWORD, "new_password": "short"},
        {"current_password": PASSWORD, "new_password": "x" * 1025},
        {"current_password": PASSWORD},
        {"current_password": PASSWORD, "new_password": NEW_PASSWORD, "user_id": UNKNOWN},
        {"current_password": None, "new_password": NEW_PASSWORD},
    ):
        problem(await call(http, server, "PUT", url, bearer(key), bad), 422)
    # Nothing changed so far: both sessions live, no audit.
    await svc.auth.authenticate_session(other_session)
    assert await audits(server, "user.password_change") == []
    no_csrf = {"Cookie": cookie["Cookie"]}
    change = {"current_password": PASSWORD, "new_password": NEW_PASSWORD}
    problem(await call(http, server, "PUT", url, no_csrf, change), 403)

    changed = await call(http, server, "PUT", url, cookie, change)
    assert changed.status == 204 and changed.body is None
    for ended in (session, other_session):
        with pytest.raises(Unauthenticated):
            await svc.auth.authenticate_session(ended)
    problem(await call(http, server, "GET", "/api/v1/users/me", cookie), 401)
    assert await svc.auth.verify_password(user_id, NEW_PASSWORD)
    # API keys are not sessions: they keep working.
    assert (await call(http, server, "GET", "/api/v1/users/me", bearer(key))).status == 200
    (audit,) = await audits(server, "user.password_change")
    assert audit.target_id == user_id and audit.actor_type == "user"
    assert audit.data == {"sessions_ended": 2}
    everything = str([tuple(row) for row in await audits(server, "user.password_change")])
    assert PASSWORD not in everything and NEW_PASSWORD not in everything

    bot_key = await agent_key(server)
    problem(await call(http, server, "PUT", url, bearer(bot_key), change), 404)
    problem(await call(http, server, "PUT", url, {}, change), 401)
