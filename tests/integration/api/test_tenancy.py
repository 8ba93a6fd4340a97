"""Issue 19, finding 10: acting in any of one's workspaces, invitations, instance-level audit.

Over a real socket on both backends. Users sign in through the login form, as a browser does;
the client keeps no cookies, so each request carries exactly the session the test hands it.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import aiohttp
import pytest
import sqlalchemy as sa

from bullpen.api.deps import SESSION_COOKIE
from bullpen.store.tables import agents, api_keys, audit_events, invitations, memberships, users
from tests.support.db import audits, count, rows
from tests.support.http import Reply, bearer, call, problem
from tests.support.login import post_login
from tests.support.servers import RunningServer

PASSWORD = "correct horse battery staple"
UNKNOWN = "00000000-0000-4000-8000-000000000000"
# What differs between any two invitations: their ids and times, and the address itself.
VOLATILE = ("id", "created_at", "expires_at", "email")


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    """An HTTP client without a cookie jar: cookies go only where a test puts them."""
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as session:
        yield session


class Browser:
    """A signed-in session: its cookie and CSRF token, as the UI's own requests carry them."""

    def __init__(self, server: RunningServer, session_id: str) -> None:
        self.session_id = session_id
        self.csrf = server.services.auth.csrf_token(session_id)

    def headers(self, method: str = "GET") -> dict[str, str]:
        """Headers for a request of this session (CSRF proof on unsafe methods)."""
        out = {"Cookie": f"{SESSION_COOKIE}={self.session_id}"}
        if method not in ("GET", "HEAD"):
            out |= {"X-CSRF-Token": self.csrf, "Sec-Fetch-Site": "same-origin"}
        return out


async def sign_in(
    client: aiohttp.ClientSession, server: RunningServer, email: str, password: str
) -> Browser:
    """Sign in through the login form; the new session."""
    resp, page = await post_login(client, server, email, password)
    assert resp.status == 303, page
    return Browser(server, resp.cookies[SESSION_COOKIE].value)


async def as_(
    client: aiohttp.ClientSession,
    server: RunningServer,
    who: Browser | dict[str, str],
    method: str,
    path: str,
    body: Any = None,
) -> Reply:
    """A request as a session or with the given (API key) headers."""
    headers = who.headers(method) if isinstance(who, Browser) else who
    return await call(client, server, method, path, headers, body)


async def new_user(client: aiohttp.ClientSession, server: RunningServer, email: str) -> str:
    """A user created by the instance admin through the API; its id."""
    body = {"email": email, "name": email.split("@")[0], "password": PASSWORD}
    created = await call(client, server, "POST", "/api/v1/users", server.auth, body)
    assert created.status == 201, created.body
    return str(created.body["id"])


async def test_a_workspace_made_through_the_api_is_reachable_by_switching(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    default = str(server.boot.workspace_id)
    admin = await sign_in(client, server, server.boot.email, server.boot.password or "")
    body = {"name": "Research", "slug": "research", "task_key": "RS"}
    made = await as_(client, server, admin, "POST", "/api/v1/workspaces", body)
    assert made.status == 201, made.body
    research = made.body["id"]

    # Its creator may switch its session there, and then acts there with the owner's role.
    switch = {"workspace_id": research}
    switched = await as_(client, server, admin, "POST", "/api/v1/session/workspace", switch)
    assert switched.status == 200, switched.body
    assert switched.body["id"] == research and switched.body["role"] == "owner"
    assert switched.body["current"] is True
    (moved,) = await audits(server, "session.switch_workspace")  # audited where it entered
    assert (str(moved.workspace_id), moved.data) == (research, {"from_workspace_id": default})
    mine = (await as_(client, server, admin, "GET", "/api/v1/workspaces")).body["items"]
    assert [(w["slug"], w["current"]) for w in mine] == [("default", False), ("research", True)]
    assert (await as_(client, server, admin, "GET", f"/api/v1/workspaces/{research}")).status == 200
    problem(await as_(client, server, admin, "GET", f"/api/v1/workspaces/{default}"), 404)
    agent = {
        "name": "analyst",
        "adapter": "llm",
        "config": {"provider": "simulated", "model": "sim-1"},
    }
    made_agent = await as_(client, server, admin, "POST", "/api/v1/agents", agent)
    assert made_agent.status == 201, made_agent.body
    (row,) = await rows(server, sa.select(agents).where(agents.c.name == "analyst"))
    assert str(row.workspace_id) == research
    listed = await as_(client, server, admin, "GET", "/api/v1/agents")
    assert [a["name"] for a in listed.body["items"]] == ["analyst"]

    # A workspace the user does not belong to is 404, and the session stays where it was.
    for target in (UNKNOWN, "not-a-uuid"):
        reply = await as_(
            client, server, admin, "POST", "/api/v1/session/workspace", {"workspace_id": target}
        )
        problem(reply, 404 if target == UNKNOWN else 422)
    assert (await as_(client, server, admin, "GET", f"/api/v1/workspaces/{research}")).status == 200

    # The UI's header offers both workspaces and switches back with a form.
    async with client.get(
        f"{server.base_url}/", headers=admin.headers(), allow_redirects=False
    ) as resp:
        page = await resp.text()
    assert resp.status == 200 and 'action="/ui/workspace"' in page
    assert re.search(rf'<option value="{research}" selected>Research</option>', page)
    form = {"csrf": admin.csrf, "workspace_id": default}
    async with client.post(
        f"{server.base_url}/ui/workspace",
        data=form,
        headers={**admin.headers(), "Sec-Fetch-Site": "same-origin"},
        allow_redirects=False,
    ) as resp:
        assert (resp.status, resp.headers["Location"]) == (303, "/")
    assert (await as_(client, server, admin, "GET", f"/api/v1/workspaces/{default}")).status == 200
    async with client.post(
        f"{server.base_url}/ui/workspace",
        data={**form, "workspace_id": research, "csrf": "wrong"},
        headers={**admin.headers(), "Sec-Fetch-Site": "same-origin"},
        allow_redirects=False,
    ) as resp:
        assert resp.status == 403
    assert (await as_(client, server, admin, "GET", f"/api/v1/workspaces/{default}")).status == 200

    # An API key made for workspace B (from a session acting in A) acts in B, and only there.
    key_body = {"name": "research ci", "workspace_id": research}
    made_key = await as_(client, server, admin, "POST", "/api/v1/api-keys", key_body)
    assert made_key.status == 201, made_key.body
    assert made_key.body["workspace_id"] == research
    in_b = bearer(made_key.body["key"])
    assert (await as_(client, server, in_b, "GET", f"/api/v1/workspaces/{research}")).status == 200
    problem(await as_(client, server, in_b, "GET", f"/api/v1/workspaces/{default}"), 404)
    listed = await as_(client, server, in_b, "GET", "/api/v1/agents")
    assert [a["name"] for a in listed.body["items"]] == ["analyst"]
    created = await as_(
        client, server, in_b, "POST", "/api/v1/tasks", {"prompt": "p" * 10, "agent_id": row.id.hex}
    )
    assert created.status == 201 and created.body["number"].startswith("RS-"), created.body
    # A key stays in its workspace: naming it is a no-op, another one is 409.
    stay = await as_(client, server, in_b, "POST", "/api/v1/session/workspace", switch)
    assert stay.status == 200 and stay.body["id"] == research
    away = await as_(
        client, server, in_b, "POST", "/api/v1/session/workspace", {"workspace_id": default}
    )
    assert "api-keys" in problem(away, 409)["detail"]
    # The instance admin's unscoped key may make one for B too; a scoped key may not.
    by_key = await as_(
        client, server, server.auth, "POST", "/api/v1/api-keys", {**key_body, "name": "k2"}
    )
    assert by_key.status == 201 and by_key.body["workspace_id"] == research
    scoped = await as_(
        client,
        server,
        server.auth,
        "POST",
        "/api/v1/api-keys",
        {"name": "s", "scopes": ["keys:write", "keys:read"]},
    )
    assert scoped.status == 201, scoped.body
    refused = await as_(
        client,
        server,
        bearer(scoped.body["key"]),
        "POST",
        "/api/v1/api-keys",
        {**key_body, "name": "k3"},
    )
    problem(refused, 403)
    # A workspace the caller does not belong to is 404; an agent's key stays with the agent.
    problem(
        await as_(
            client,
            server,
            admin,
            "POST",
            "/api/v1/api-keys",
            {"name": "x", "workspace_id": UNKNOWN},
        ),
        404,
    )
    agent_in_b = {"name": "x", "workspace_id": research, "agent_id": str(server.boot.agent_id)}
    problem(await as_(client, server, admin, "POST", "/api/v1/api-keys", agent_in_b), 404)
    keys = await rows(server, sa.select(api_keys.c.name, api_keys.c.workspace_id))
    assert {(k.name, str(k.workspace_id)) for k in keys} >= {
        ("research ci", research),
        ("k2", research),
        ("s", default),
    }
    assert not any(k.name in ("k3", "x") for k in keys)
    (audit,) = await rows(
        server,
        sa.select(audit_events).where(
            audit_events.c.action == "api_key.create",
            audit_events.c.target_id == uuid.UUID(made_key.body["id"]),
        ),
    )
    assert str(audit.workspace_id) == research


async def test_removed_member_can_no_longer_act_there(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    default = str(server.boot.workspace_id)
    made = await call(
        client,
        server,
        "POST",
        "/api/v1/workspaces",
        server.auth,
        {"name": "Lab", "slug": "lab", "task_key": "LB"},
    )
    lab = made.body["id"]
    owner_in_lab = bearer(
        (
            await call(
                client,
                server,
                "POST",
                "/api/v1/api-keys",
                server.auth,
                {"name": "lab", "workspace_id": lab},
            )
        ).body["key"]
    )
    ada = await new_user(client, server, "ada@x.io")
    for who in (server.auth, owner_in_lab):
        invited = await call(
            client,
            server,
            "POST",
            "/api/v1/invitations",
            who,
            {"email": "ada@x.io", "role": "member"},
        )
        assert invited.status == 201, invited.body

    # In no workspace yet: signed in, but it may only read and answer its invitations.
    browser = await sign_in(client, server, "ada@x.io", PASSWORD)
    problem(await as_(client, server, browser, "GET", "/api/v1/tasks"), 403)
    assert (await as_(client, server, browser, "GET", "/api/v1/workspaces")).body["items"] == []
    mine = (await as_(client, server, browser, "GET", "/api/v1/users/me/invitations")).body["items"]
    assert sorted(i["workspace_name"] for i in mine) == ["Default", "Lab"]
    for invitation in mine:
        accepted = await as_(
            client,
            server,
            browser,
            "POST",
            f"/api/v1/users/me/invitations/{invitation['id']}/accept",
        )
        assert accepted.status == 200 and accepted.body["role"] == "member", accepted.body
    switched = await as_(
        client, server, browser, "POST", "/api/v1/session/workspace", {"workspace_id": lab}
    )
    assert switched.status == 200
    key_here = bearer(
        (await as_(client, server, browser, "POST", "/api/v1/api-keys", {"name": "a"})).body["key"]
    )
    key_default = bearer(
        (
            await as_(
                client,
                server,
                browser,
                "POST",
                "/api/v1/api-keys",
                {"name": "d", "workspace_id": default},
            )
        ).body["key"]
    )
    assert (await as_(client, server, key_here, "GET", "/api/v1/tasks")).status == 200
    assert (await as_(client, server, browser, "GET", "/api/v1/tasks")).status == 200

    removed = await call(client, server, "DELETE", f"/api/v1/members/{ada}", owner_in_lab)
    assert removed.status == 204
    # Its key and its session there stop at once; its other workspace is untouched.
    problem(await as_(client, server, key_here, "GET", "/api/v1/tasks"), 401)
    problem(await as_(client, server, browser, "GET", "/api/v1/tasks"), 401)
    assert (await as_(client, server, key_default, "GET", "/api/v1/tasks")).status == 200
    again = await sign_in(client, server, "ada@x.io", PASSWORD)
    here = (await as_(client, server, again, "GET", "/api/v1/workspaces")).body["items"]
    assert [(w["slug"], w["current"]) for w in here] == [("default", True)]
    back = await as_(
        client, server, again, "POST", "/api/v1/session/workspace", {"workspace_id": lab}
    )
    problem(back, 404)
    problem(
        await as_(
            client, server, again, "POST", "/api/v1/api-keys", {"name": "b", "workspace_id": lab}
        ),
        404,
    )
    problem(await as_(client, server, key_default, "GET", f"/api/v1/workspaces/{lab}"), 404)
    # A session switched there whose membership then ends cannot act there either.
    async with server.services.store.write() as conn:
        await conn.execute(
            memberships.delete().where(
                memberships.c.user_id == uuid.UUID(ada),
                memberships.c.workspace_id == server.boot.workspace_id,
            )
        )
    problem(await as_(client, server, again, "GET", "/api/v1/tasks"), 401)
    problem(await as_(client, server, key_default, "GET", "/api/v1/tasks"), 401)


async def test_invitations_reveal_no_account_and_join_only_on_acceptance(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    ws = server.boot.workspace_id
    ada = await new_user(client, server, "ada@x.io")
    await new_user(client, server, "eve@x.io")
    members_before = await count(server, memberships)

    # An email with an account and one without get the same answer, on both routes.
    answers = []
    for path in ("/api/v1/invitations", "/api/v1/members"):
        for email in ("ADA@x.io", "nobody@x.io"):
            reply = await call(
                client, server, "POST", path, server.auth, {"email": email, "role": "member"}
            )
            assert reply.status == 201, reply.body
            assert reply.headers["Location"] == f"/api/v1/invitations/{reply.body['id']}"
            answers.append(
                (
                    reply.status,
                    {k: v for k, v in reply.body.items() if k not in VOLATILE},
                    sorted(reply.body),
                )
            )
    assert all(answer == answers[0] for answer in answers), answers
    # Nobody joined: inviting is not attaching.
    assert await count(server, memberships) == members_before
    listed = await call(client, server, "GET", "/api/v1/members", server.auth)
    assert "ada@x.io" not in [m["email"] for m in listed.body["items"]]
    pending = (await call(client, server, "GET", "/api/v1/invitations", server.auth)).body["items"]
    assert sorted(i["email"] for i in pending) == [
        "ada@x.io",
        "nobody@x.io",
    ]  # renewed, not doubled

    # Someone else cannot see or answer Ada's invitation.
    eve = await sign_in(client, server, "eve@x.io", PASSWORD)
    assert (await as_(client, server, eve, "GET", "/api/v1/users/me/invitations")).body[
        "items"
    ] == []
    ada_invitation = next(i for i in pending if i["email"] == "ada@x.io")["id"]
    for verb in ("accept", "decline"):
        path = f"/api/v1/users/me/invitations/{ada_invitation}/{verb}"
        problem(await as_(client, server, eve, "POST", path), 404)
    # An agent's key has no invitations.
    agent = await call(
        client,
        server,
        "POST",
        "/api/v1/api-keys",
        server.auth,
        {"name": "bot", "agent_id": str(server.boot.agent_id)},
    )
    problem(
        await call(
            client, server, "GET", "/api/v1/users/me/invitations", bearer(agent.body["key"])
        ),
        404,
    )

    # Ada sees it, accepts it, and only then is a member, with the invited role.
    browser = await sign_in(client, server, "ada@x.io", PASSWORD)
    seen = (await as_(client, server, browser, "GET", "/api/v1/users/me/invitations")).body["items"]
    assert [(i["id"], i["workspace_name"], i["role"]) for i in seen] == [
        (ada_invitation, "Default", "member")
    ]
    accepted = await as_(
        client, server, browser, "POST", f"/api/v1/users/me/invitations/{ada_invitation}/accept"
    )
    assert accepted.status == 200 and accepted.body["id"] == str(ws), accepted.body
    assert await count(server, memberships) == members_before + 1
    member = await call(client, server, "GET", f"/api/v1/members/{ada}", server.auth)
    assert member.status == 200 and member.body["role"] == "member"
    joined = [a for a in await audits(server, "member.add") if str(a.target_id) == ada]
    assert len(joined) == 1 and joined[0].workspace_id == ws
    assert joined[0].data["role"] == "member" and joined[0].actor_id == uuid.UUID(ada)
    problem(
        await as_(
            client, server, browser, "POST", f"/api/v1/users/me/invitations/{ada_invitation}/accept"
        ),
        404,
    )
    # A member already: inviting again is 409 (the member list shows it to every member anyway).
    problem(
        await call(
            client,
            server,
            "POST",
            "/api/v1/invitations",
            server.auth,
            {"email": "ada@x.io", "role": "admin"},
        ),
        409,
    )

    # Declining, revoking and expiry each leave no membership behind.
    declined = await call(
        client,
        server,
        "POST",
        "/api/v1/invitations",
        server.auth,
        {"email": "eve@x.io", "role": "viewer"},
    )
    no = await as_(
        client, server, eve, "POST", f"/api/v1/users/me/invitations/{declined.body['id']}/decline"
    )
    assert no.status == 204
    assert (await as_(client, server, eve, "GET", "/api/v1/users/me/invitations")).body[
        "items"
    ] == []
    revoked = await call(
        client,
        server,
        "POST",
        "/api/v1/invitations",
        server.auth,
        {"email": "eve@x.io", "role": "viewer"},
    )
    gone = await call(
        client, server, "DELETE", f"/api/v1/invitations/{revoked.body['id']}", server.auth
    )
    assert gone.status == 204
    problem(
        await as_(
            client, server, eve, "POST", f"/api/v1/users/me/invitations/{revoked.body['id']}/accept"
        ),
        404,
    )
    stale = await call(
        client,
        server,
        "POST",
        "/api/v1/invitations",
        server.auth,
        {"email": "eve@x.io", "role": "viewer"},
    )
    async with server.services.store.write() as conn:
        past = server.services.clock() - timedelta(seconds=1)
        await conn.execute(
            invitations.update()
            .where(invitations.c.id == uuid.UUID(stale.body["id"]))
            .values(expires_at=past)
        )
    assert (await as_(client, server, eve, "GET", "/api/v1/users/me/invitations")).body[
        "items"
    ] == []
    problem(
        await as_(
            client, server, eve, "POST", f"/api/v1/users/me/invitations/{stale.body['id']}/accept"
        ),
        404,
    )
    eve_id = (await rows(server, sa.select(users.c.id).where(users.c.email == "eve@x.io")))[0].id
    assert await count(server, memberships, memberships.c.user_id == eve_id) == 0

    # Only owners invite owners; viewers and members do not invite at all.
    # Accepting does not move the session: it switches there when it wants to act there.
    problem(await as_(client, server, browser, "POST", "/api/v1/api-keys", {"name": "m"}), 403)
    to_ws = {"workspace_id": str(ws)}
    assert (
        await as_(client, server, browser, "POST", "/api/v1/session/workspace", to_ws)
    ).status == 200
    ada_key = await as_(client, server, browser, "POST", "/api/v1/api-keys", {"name": "m"})
    as_member = bearer(ada_key.body["key"])
    viewer_invite = {"email": "z@x.io", "role": "viewer"}
    problem(
        await call(client, server, "POST", "/api/v1/invitations", as_member, viewer_invite), 403
    )
    for bad in (
        {"email": "not-an-email", "role": "member"},
        {"email": "z@x.io", "role": "god"},
        {"email": "z@x.io"},
    ):
        problem(await call(client, server, "POST", "/api/v1/invitations", server.auth, bad), 422)
    actions = {a.action for a in await rows(server, sa.select(audit_events.c.action))}
    assert {"invitation.create", "invitation.decline", "invitation.revoke"} <= actions


async def test_instance_admin_actions_are_audited_at_instance_level(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    ada = await new_user(client, server, "ada@x.io")
    renamed = await call(
        client, server, "PATCH", f"/api/v1/users/{ada}", server.auth, {"name": "Ada L."}
    )
    assert renamed.status == 200
    made = await call(
        client,
        server,
        "POST",
        "/api/v1/workspaces",
        server.auth,
        {"name": "Lab", "slug": "lab", "task_key": "LB"},
    )
    for action in ("user.create", "user.update"):
        (row,) = await audits(server, action)
        assert row.workspace_id is None and str(row.target_id) == ada, action
    # A new workspace's own log starts with its creation; the instance log has it too.
    created = await audits(server, "workspace.create")
    assert sorted(str(row.workspace_id) for row in created) == sorted([made.body["id"], "None"])

    # Instance admins read the instance log; the workspace's log does not hold these.
    log = await call(client, server, "GET", "/api/v1/audit-events/instance", server.auth)
    assert log.status == 200, log.body
    assert [e["action"] for e in log.body["items"]] == [
        "workspace.create",
        "user.update",
        "user.create",
    ]
    only = await call(
        client, server, "GET", "/api/v1/audit-events/instance?action=user.create", server.auth
    )
    assert [e["target_id"] for e in only.body["items"]] == [ada]
    here = await call(client, server, "GET", "/api/v1/audit-events", server.auth)
    assert not {"user.create", "user.update", "workspace.create"} & {
        e["action"] for e in here.body["items"]
    }
    # Nobody else reads it, the workspace's owner included.
    invited = await call(
        client,
        server,
        "POST",
        "/api/v1/invitations",
        server.auth,
        {"email": "ada@x.io", "role": "owner"},
    )
    browser = await sign_in(client, server, "ada@x.io", PASSWORD)
    await as_(
        client, server, browser, "POST", f"/api/v1/users/me/invitations/{invited.body['id']}/accept"
    )
    await as_(
        client,
        server,
        browser,
        "POST",
        "/api/v1/session/workspace",
        {"workspace_id": str(server.boot.workspace_id)},
    )
    problem(await as_(client, server, browser, "GET", "/api/v1/audit-events/instance"), 403)
    problem(await call(client, server, "GET", "/api/v1/audit-events/instance", {}), 401)


async def test_an_instance_admin_in_no_workspace_can_make_one(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    body = {"email": "root@x.io", "name": "root", "password": PASSWORD, "is_instance_admin": True}
    assert (await call(client, server, "POST", "/api/v1/users", server.auth, body)).status == 201
    root = await sign_in(client, server, "root@x.io", PASSWORD)
    made = {"name": "Ops", "slug": "ops", "task_key": "OP"}
    # Idempotency keys live in a workspace: none yet, so the header is refused, nothing made.
    keyed = {**root.headers("POST"), "Idempotency-Key": "ops-1"}
    problem(await call(client, server, "POST", "/api/v1/workspaces", keyed, made), 409)
    problem(await as_(client, server, root, "GET", "/api/v1/tasks"), 403)
    created = await as_(client, server, root, "POST", "/api/v1/workspaces", made)
    assert created.status == 201, created.body
    # The refusal was audited in no workspace (there is none to put it in).
    (denied,) = await audits(server, "access.denied")
    assert denied.workspace_id is None
    switch = {"workspace_id": created.body["id"]}
    assert (
        await as_(client, server, root, "POST", "/api/v1/session/workspace", switch)
    ).status == 200
    assert (await as_(client, server, root, "GET", "/api/v1/tasks")).status == 200
