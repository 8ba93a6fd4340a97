"""Workspaces and members over a real socket, on both backends: rules, audit, tenancy, delete.

Each test walks a whole flow: a server per test costs seconds, a request milliseconds.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import aiohttp
import pytest
import sqlalchemy as sa

from bullpen.api.deps import SESSION_COOKIE
from bullpen.domain import tokens
from bullpen.domain.events import EventKind, RunEvent
from bullpen.domain.principal import Role
from bullpen.errors import Unauthenticated
from bullpen.store import agents as agent_store
from bullpen.store import events as event_store
from bullpen.store import identity
from bullpen.store import tasks as task_store
from bullpen.store.tables import (
    agents,
    api_keys,
    audit_events,
    idempotency_keys,
    memberships,
    run_events,
    runs,
    sessions,
    task_comments,
    tasks,
    users,
    workspaces,
)
from tests.support.db import audits, count, rows
from tests.support.http import bearer, call, problem
from tests.support.seed import (
    Member,
    agent_key,
    insert_task,
    member_with_key,
    new_member,
    open_session,
    other_workspace,
)
from tests.support.servers import RunningServer

UNKNOWN = "00000000-0000-4000-8000-000000000000"


async def people(server: RunningServer, *roles: Role) -> dict[Role, Member]:
    """A user with a key per role in the default workspace, by role."""
    return {role: await new_member(server, role, f"{role.value}@x.io") for role in roles}


async def test_workspaces_list_create_read_rename(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    svc = server.services
    default = str(server.boot.workspace_id)
    staff = await people(server, Role.ADMIN, Role.MEMBER)
    admin, member = bearer(staff[Role.ADMIN].key), bearer(staff[Role.MEMBER].key)

    listing = await call(http, server, "GET", "/api/v1/workspaces", server.auth)
    assert listing.status == 200
    assert listing.body["items"] == [
        {
            "id": default,
            "name": "Default",
            "slug": "default",
            "task_key": "BP",
            "role": "owner",
            "current": True,
        }
    ]

    body = {"name": "Research", "slug": "research", "task_key": "RS"}
    idem = {**server.auth, "Idempotency-Key": "ws-1"}
    created = await call(http, server, "POST", "/api/v1/workspaces", idem, body)
    assert created.status == 201, created.body
    new = created.body["id"]
    assert created.headers["Location"] == f"/api/v1/workspaces/{new}"
    assert {k: created.body[k] for k in body} == body and created.body["created_at"]
    replay = await call(http, server, "POST", "/api/v1/workspaces", idem, body)
    assert replay.status == 201 and replay.body == created.body
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert await count(server, workspaces) == 2

    mine = (await call(http, server, "GET", "/api/v1/workspaces", server.auth)).body["items"]
    assert [(w["slug"], w["role"], w["current"]) for w in mine] == [
        ("default", "owner", True),
        ("research", "owner", False),
    ]
    # The creator is the new workspace's owner; its log starts with the creation.
    owners = await rows(
        server, sa.select(memberships).where(memberships.c.workspace_id == uuid.UUID(new))
    )
    assert [(m.user_id, m.role) for m in owners] == [(await _boot_user(server), "owner")]
    # ... and the instance's log has it too (finding 10 of issue 19).
    instance, audit = sorted(
        await audits(server, "workspace.create"), key=lambda a: a.workspace_id is not None
    )
    assert instance.workspace_id is None and str(instance.target_id) == new
    assert str(audit.workspace_id) == new and str(audit.target_id) == new
    assert audit.data["slug"] == "research" and audit.actor_type == "api_key"

    # Member of the default workspace only: the admin's list shows just that one.
    theirs = (await call(http, server, "GET", "/api/v1/workspaces", admin)).body["items"]
    assert [(w["slug"], w["role"]) for w in theirs] == [("default", "admin")]

    dup = await call(http, server, "POST", "/api/v1/workspaces", server.auth, body)
    assert "research" in problem(dup, 409)["detail"]
    for bad, field in [
        ({**body, "slug": "Research"}, "slug"),
        ({**body, "slug": "r"}, "slug"),
        ({**body, "slug": "-research"}, "slug"),
        ({**body, "task_key": "rs"}, "task_key"),
        ({**body, "task_key": "R" * 11}, "task_key"),
        ({**body, "name": ""}, "name"),
        ({**body, "name": "x" * 201}, "name"),
        ({**body, "name": "bell\x07"}, "name"),
        ({**body, "name": " padded"}, "name"),
        ({**body, "name": None}, "name"),
        ({**body, "id": UNKNOWN}, "id"),
        ({"name": "n", "slug": "nn"}, "task_key"),
    ]:
        reply = await call(http, server, "POST", "/api/v1/workspaces", server.auth, bad)
        assert any(e["field"] == field for e in problem(reply, 422)["errors"]), (bad, reply.body)
    # Not an instance admin: refused, audited, nothing created.
    other = {"name": "Nope", "slug": "nope", "task_key": "NO"}
    problem(await call(http, server, "POST", "/api/v1/workspaces", admin, other), 403)
    assert await count(server, workspaces) == 2
    assert await count(server, audit_events, audit_events.c.action == "access.denied") == 1

    got = await call(http, server, "GET", f"/api/v1/workspaces/{default}", member)
    assert got.status == 200 and got.body["slug"] == "default"
    # Another workspace is 404 even to its owner, while acting in this one.
    for path in (f"/api/v1/workspaces/{new}", f"/api/v1/workspaces/{UNKNOWN}"):
        problem(await call(http, server, "GET", path, server.auth), 404)
        problem(await call(http, server, "PATCH", path, server.auth, {"name": "x"}), 404)
    problem(await call(http, server, "GET", "/api/v1/workspaces/nope", server.auth), 422)

    path = f"/api/v1/workspaces/{default}"
    renamed = await call(http, server, "PATCH", path, admin, {"name": "Main"})
    assert renamed.status == 200 and renamed.body["name"] == "Main"
    assert renamed.body["slug"] == "default"
    unchanged = await call(http, server, "PATCH", path, admin, {})
    assert unchanged.status == 200 and unchanged.body["name"] == "Main"
    (update,) = await audits(server, "workspace.update")
    assert update.data == {"before": {"name": "Default"}, "after": {"name": "Main"}}
    assert update.actor_id == staff[Role.ADMIN].key_id
    for bad in ({"name": None}, {"slug": "other"}, {"name": ""}, {"name": "a\nb"}):
        problem(await call(http, server, "PATCH", path, admin, bad), 422)
    problem(await call(http, server, "PATCH", path, member, {"name": "Mine"}), 403)
    async with svc.store.read() as conn:
        assert (
            await conn.execute(
                sa.select(workspaces.c.name).where(workspaces.c.id == server.boot.workspace_id)
            )
        ).scalar_one() == "Main"
    assert len(await audits(server, "workspace.update")) == 1

    # An agent's key sees only its own workspace.
    bot_key = await agent_key(server)
    seen = (await call(http, server, "GET", "/api/v1/workspaces", bearer(bot_key))).body["items"]
    assert [(w["id"], w["current"]) for w in seen] == [(default, True)]
    problem(await call(http, server, "GET", "/api/v1/workspaces", {}), 401)


async def test_members_roles_and_owner_rules(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    svc = server.services
    staff = await people(server, Role.ADMIN, Role.VIEWER, Role.MEMBER)
    admin, viewer = bearer(staff[Role.ADMIN].key), bearer(staff[Role.VIEWER].key)
    boss = str(await _boot_user(server))
    async with svc.store.write() as conn:
        newcomer = await identity.create_user(
            conn,
            email="ada@x.io",
            name="Ada",
            password_hash="x",
            is_instance_admin=False,
            now=svc.clock(),
        )

    listing = await call(http, server, "GET", "/api/v1/members", viewer)
    assert listing.status == 200 and listing.body["next_cursor"] is None
    assert [(m["user_id"], m["role"]) for m in listing.body["items"]] == [
        (boss, "owner"),
        *((str(staff[r].user_id), r.value) for r in (Role.ADMIN, Role.VIEWER, Role.MEMBER)),
    ]
    first = listing.body["items"][0]
    assert first["email"] == "admin@bullpen.local" and first["name"] and first["created_at"]
    page = await call(http, server, "GET", "/api/v1/members?limit=3", viewer)
    assert len(page.body["items"]) == 3 and page.body["next_cursor"]
    rest = await call(
        http, server, "GET", f"/api/v1/members?limit=3&cursor={page.body['next_cursor']}", viewer
    )
    assert [m["user_id"] for m in page.body["items"] + rest.body["items"]] == [
        m["user_id"] for m in listing.body["items"]
    ]

    # A viewer may not add: refused, and the memberships are exactly as before.
    add = {"email": "ADA@x.io", "role": "member"}
    before = await count(server, memberships)
    problem(await call(http, server, "POST", "/api/v1/members", viewer, add), 403)
    assert await count(server, memberships) == before

    # Since issue 19 adding invites: the user joins only by accepting (test_tenancy.py).
    added = await call(http, server, "POST", "/api/v1/members", admin, add)
    assert added.status == 201, added.body
    assert added.body["email"] == "ada@x.io" and added.body["role"] == "member"
    assert added.headers["Location"] == f"/api/v1/invitations/{added.body['id']}"
    assert await count(server, memberships) == before
    problem(await call(http, server, "GET", f"/api/v1/members/{newcomer}", viewer), 404)
    accepted = await call(
        http,
        server,
        "POST",
        f"/api/v1/users/me/invitations/{added.body['id']}/accept",
        await _no_workspace_session(server, newcomer),
    )
    assert accepted.status == 200, accepted.body
    got = await call(http, server, "GET", f"/api/v1/members/{newcomer}", viewer)
    assert got.status == 200 and got.body["email"] == "ada@x.io" and got.body["role"] == "member"
    (audit,) = await audits(server, "member.add")
    assert audit.target_id == newcomer and audit.data["role"] == "member"

    problem(await call(http, server, "POST", "/api/v1/members", admin, add), 409)
    # An unknown email gets the same answer as a known one: no account is revealed.
    unknown = await call(
        http, server, "POST", "/api/v1/members", admin, {"email": "no@x.io", "role": "member"}
    )
    assert unknown.status == 201 and unknown.body["email"] == "no@x.io"
    grant = {"email": "member@x.io", "role": "owner"}
    assert (
        "owner"
        in problem(await call(http, server, "POST", "/api/v1/members", admin, grant), 403)["detail"]
    )
    for bad in (
        {"email": "ada@x.io", "role": "god"},
        {"email": "not-an-email", "role": "member"},
        {"email": "ada@x.io"},
        {"email": "ada@x.io", "role": "member", "user_id": boss},
    ):
        problem(await call(http, server, "POST", "/api/v1/members", admin, bad), 422)
    assert await count(server, memberships) == before + 1

    path = f"/api/v1/members/{newcomer}"
    changed = await call(http, server, "PATCH", path, admin, {"role": "admin"})
    assert changed.status == 200 and changed.body["role"] == "admin"
    (update,) = await audits(server, "member.update")
    assert update.data == {"before": {"role": "member"}, "after": {"role": "admin"}}
    for bad in ({"role": None}, {}, {"role": "admin", "email": "x@x.io"}):
        problem(await call(http, server, "PATCH", path, admin, bad), 422)
    # Only an owner grants owner, or touches an owner's role.
    problem(await call(http, server, "PATCH", path, admin, {"role": "owner"}), 403)
    boss_path = f"/api/v1/members/{boss}"
    problem(await call(http, server, "PATCH", boss_path, admin, {"role": "member"}), 403)
    problem(await call(http, server, "PATCH", path, viewer, {"role": "viewer"}), 403)
    last = await call(http, server, "PATCH", boss_path, server.auth, {"role": "admin"})
    assert "last owner" in problem(last, 409)["detail"]
    problem(await call(http, server, "DELETE", boss_path, server.auth), 409)
    problem(await call(http, server, "DELETE", boss_path, admin), 403)
    problem(
        await call(http, server, "PATCH", f"/api/v1/members/{UNKNOWN}", admin, {"role": "admin"}),
        404,
    )
    problem(await call(http, server, "DELETE", f"/api/v1/members/{UNKNOWN}", admin), 404)
    roles = await rows(server, sa.select(memberships.c.user_id, memberships.c.role))
    assert {(str(u), r) for u, r in roles} >= {(boss, "owner"), (str(newcomer), "admin")}
    assert len(await audits(server, "member.update")) == 1

    # Two owners: now one may step down; the other remains the last.
    promoted = await call(http, server, "PATCH", path, server.auth, {"role": "owner"})
    assert promoted.status == 200 and promoted.body["role"] == "owner"
    problem(await call(http, server, "DELETE", path, admin), 403)  # admins never remove owners

    # Removing a member ends its sessions and revokes its keys in this workspace.
    member_id, _, member_key = staff[Role.MEMBER]
    session = await open_session(server, member_id)
    assert (await call(http, server, "GET", "/api/v1/members", bearer(member_key))).status == 200
    removed = await call(http, server, "DELETE", f"/api/v1/members/{member_id}", admin)
    assert removed.status == 204 and removed.body is None
    problem(await call(http, server, "GET", f"/api/v1/members/{member_id}", admin), 404)
    problem(await call(http, server, "GET", "/api/v1/members", bearer(member_key)), 401)
    with pytest.raises(Unauthenticated):
        await svc.auth.authenticate_session(session)
    (audit,) = await audits(server, "member.remove")
    assert audit.target_id == member_id
    assert audit.data == {
        "email": "member@x.io",
        "role": "member",
        "sessions_ended": 1,
        "keys_revoked": 1,
    }
    # Re-adding the user does not revive the old key.
    again = {"email": "member@x.io", "role": "member"}
    assert (await call(http, server, "POST", "/api/v1/members", admin, again)).status == 201
    problem(await call(http, server, "GET", "/api/v1/members", bearer(member_key)), 401)

    # Another workspace's owner sees none of this workspace's members.
    async with svc.store.write() as conn:
        _, _, their_key = await other_workspace(conn, secret=svc.secret, now=svc.clock())
    theirs = bearer(their_key)
    listed = await call(http, server, "GET", "/api/v1/members", theirs)
    assert [m["email"] for m in listed.body["items"]] == ["o@x.io"]
    problem(await call(http, server, "GET", path, theirs), 404)
    problem(await call(http, server, "PATCH", path, theirs, {"role": "viewer"}), 404)
    problem(await call(http, server, "DELETE", path, theirs), 404)
    assert (await call(http, server, "GET", path, admin)).body["role"] == "owner"


async def test_delete_workspace_takes_everything_in_it(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    svc = server.services
    now = svc.clock()
    async with svc.store.write() as conn:
        ws = await identity.create_workspace(
            conn, name="Doomed", slug="doomed", task_key="DM", now=now
        )
        keys = {}
        for role in (Role.OWNER, Role.ADMIN):
            _, keys[role] = await member_with_key(
                conn, ws, role=role, secret=svc.secret, email=f"{role.value}@doomed.io", now=now
            )
        agent = await agent_store.create_agent(
            conn, workspace_id=ws, name="a", title="", adapter="llm", config={}, now=now
        )
        done, _ = await insert_task(conn, ws, agent, now)
        busy, busy_run = await insert_task(conn, ws, agent, now)
        # Held by a (pretend) worker elsewhere: running, with a live lease.
        await conn.execute(
            runs.update()
            .where(runs.c.workspace_id == ws)
            .values(status="running", lease_owner="w", lease_expires_at=now + timedelta(hours=1))
        )
        event = RunEvent(busy_run.id, busy.id, 1, EventKind.STATUS, {"status": "running"})
        await event_store.append(conn, [event], [ws], now)
        await task_store.add_comment(
            conn,
            workspace_id=ws,
            task_id=done.id,
            author_type="user",
            author_id=None,
            body="hi",
            now=now,
        )
        owner_id = (
            await conn.execute(sa.select(users.c.id).where(users.c.email == "owner@doomed.io"))
        ).scalar_one()
        await identity.create_session(
            conn,
            digest=tokens.digest(svc.secret, tokens.new_session_id()),
            user_id=owner_id,
            workspace_id=ws,
            now=now,
            expires_at=now + timedelta(hours=1),
        )
    owner, admin = bearer(keys[Role.OWNER]), bearer(keys[Role.ADMIN])
    # An idempotency key stored in the doomed workspace.
    idem = {**owner, "Idempotency-Key": "k"}
    add = {"email": "admin@bullpen.local", "role": "viewer"}
    assert (await call(http, server, "POST", "/api/v1/members", idem, add)).status == 201

    tables = (agents, tasks, runs, run_events, task_comments, api_keys, memberships, sessions)
    tables += (idempotency_keys,)

    async def in_doomed() -> dict[str, int]:
        return {t.name: await count(server, t, t.c.workspace_id == ws) for t in tables}

    held = await in_doomed()
    assert all(held.values()), held
    elsewhere = {t.name: await count(server, t) - held[t.name] for t in tables}

    path = f"/api/v1/workspaces/{ws}"
    problem(await call(http, server, "DELETE", path, admin), 403)  # owners only
    problem(await call(http, server, "DELETE", path, server.auth), 404)  # not its workspace
    problem(await call(http, server, "DELETE", f"/api/v1/workspaces/{UNKNOWN}", owner), 404)
    problem(await call(http, server, "DELETE", "/api/v1/workspaces/x", owner), 422)
    busy_reply = await call(http, server, "DELETE", path, owner)
    assert "running" in problem(busy_reply, 409)["detail"]
    assert await in_doomed() == held and await count(server, workspaces, workspaces.c.id == ws)

    async with svc.store.write() as conn:
        await conn.execute(runs.update().where(runs.c.workspace_id == ws).values(status="done"))
    deleted = await call(http, server, "DELETE", path, owner)
    assert deleted.status == 204 and deleted.body is None
    assert await count(server, workspaces, workspaces.c.id == ws) == 0
    assert set((await in_doomed()).values()) == {0}
    assert {t.name: await count(server, t) for t in tables} == elsewhere
    # The users themselves remain (they may belong elsewhere); their access here is gone.
    assert await count(server, users, users.c.email.like("%@doomed.io")) == 2
    problem(await call(http, server, "GET", "/api/v1/workspaces", owner), 401)
    (audit,) = await audits(server, "workspace.delete")
    assert audit.workspace_id == ws and audit.target_id == ws
    assert audit.data["slug"] == "doomed" and audit.data["deleted"]["tasks"] == 2
    # The rest of the instance still works.
    mine = await call(http, server, "GET", "/api/v1/workspaces", server.auth)
    assert [w["slug"] for w in mine.body["items"]] == ["default"]


async def _boot_user(server: RunningServer) -> uuid.UUID:
    query = sa.select(users.c.id).where(users.c.email == server.boot.email)
    return (await rows(server, query))[0].id


async def _no_workspace_session(server: RunningServer, user_id: uuid.UUID) -> dict[str, str]:
    """Cookie and CSRF headers of a session of a user who belongs to no workspace yet."""
    svc = server.services
    session = tokens.new_session_id()
    async with svc.store.write() as conn:
        await identity.create_session(
            conn,
            digest=tokens.digest(svc.secret, session),
            user_id=user_id,
            workspace_id=None,
            now=svc.clock(),
            expires_at=svc.clock() + timedelta(hours=1),
        )
    return {
        "Cookie": f"{SESSION_COOKIE}={session}",
        "X-CSRF-Token": svc.auth.csrf_token(session),
        "Sec-Fetch-Site": "same-origin",
    }
