"""Keyset cursors on every list endpoint that takes one, over a real socket on both backends.

A cursor is opaque, but a caller can craft one: whatever it decodes to, a cursor the API did not
issue is a 422 problem naming `cursor`, never a 500 (an out-of-range date once overflowed when
converted to UTC for the query).
"""

from __future__ import annotations

import base64
import uuid

import aiohttp

from tests.support.http import call, problem
from tests.support.servers import RunningServer

PROMPT = "Analyze this dataset and extract key metrics"


def crafted(created: str, row_id: str = str(uuid.uuid4())) -> str:
    """A cursor in the API's own encoding, pointing after (created, row_id)."""
    return base64.urlsafe_b64encode(f"{created}|{row_id}".encode()).decode().rstrip("=")


# Decodes to a date, but one that leaves datetime's range once moved to UTC, or is no cursor.
BAD_CURSORS = [
    crafted("0001-01-01T00:00:00+14:00"),
    crafted("0001-01-01T00:00:00+00:01"),
    crafted("9999-12-31T23:59:59-14:00"),
    crafted("9999-12-31T23:59:59.999999-00:00:01"),
    crafted("2026-01-01T00:00:00"),  # naive
    crafted("2026-13-01T00:00:00+00:00"),
    crafted("2026-01-01T00:00:00+00:00", "not-a-uuid"),
    crafted("2026-01-01T00:00:00+00:00|x"),
    base64.urlsafe_b64encode(b"\xff\xfe|\x00").decode(),
    "%%%",
    "Zm9v",
]
# The extremes datetime can hold in UTC are valid positions: before or after every row.
EDGE_CURSORS = [
    crafted("0001-01-01T00:00:00+00:00"),
    crafted("9999-12-31T23:59:59.999999+00:00"),
]


async def list_paths(http: aiohttp.ClientSession, server: RunningServer) -> list[str]:
    """Every list endpoint that takes a cursor, with a row behind each id it needs."""
    agent = str(server.boot.agent_id)
    task = await call(
        http, server, "POST", "/api/v1/tasks", body={"prompt": PROMPT, "agent_id": agent}
    )
    assert task.status == 201, task.text
    routine = await call(
        http,
        server,
        "POST",
        "/api/v1/routines",
        body={
            "name": "yearly",
            "agent_id": agent,
            "cron": "0 0 1 1 *",
            "timezone": "UTC",
            "prompt": PROMPT,
        },
    )
    assert routine.status == 201, routine.text
    return [
        "/api/v1/tasks",
        f"/api/v1/tasks/{task.body['id']}/comments",
        "/api/v1/routines",
        f"/api/v1/routines/{routine.body['id']}/fires",
        "/api/v1/members",
        "/api/v1/users",
        "/api/v1/audit-events",
    ]


async def test_a_crafted_cursor_is_a_422_on_every_list_endpoint(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    for path in await list_paths(http, server):
        for cursor in BAD_CURSORS:
            reply = await call(http, server, "GET", f"{path}?cursor={cursor}")
            refused = problem(reply, 422)
            assert refused["type"] == "https://bullpen.dev/problems/validation", (path, cursor)
            assert [(e["location"], e["field"]) for e in refused["errors"]] == [
                ("query", "cursor")
            ], (path, cursor)
        for cursor in EDGE_CURSORS:
            reply = await call(http, server, "GET", f"{path}?cursor={cursor}")
            assert reply.status == 200, (path, cursor, reply.text)
            assert isinstance(reply.body["items"], list)
