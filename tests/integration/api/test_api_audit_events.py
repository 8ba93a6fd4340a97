"""`since` and `until` on the audit log's two list endpoints, over a real socket on both
backends: `since` inclusive and `until` exclusive to the microsecond, offsets and offset-less
times (UTC) alike, keyset pages across a time-filtered set with ties on the same instant, and
bad input as a 422 problem naming the field, never a 500."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

import aiohttp
import pytest

from bullpen.store import audit
from tests.support.http import call, problem
from tests.support.servers import RunningServer

BASE = datetime(2026, 1, 10, 8, 0, 0, 250_000, tzinfo=UTC)  # far from the server's own events
SEEDED = 30  # one event a minute from BASE
TIED = 3  # more events at the minute 15, the same instant
PATHS = ("/api/v1/audit-events", "/api/v1/audit-events/instance")


async def seed(server: RunningServer, workspace_id: uuid.UUID | None) -> None:
    """SEEDED events a minute apart from BASE, and TIED more at BASE + 15 minutes."""
    moments = [BASE + timedelta(minutes=i) for i in range(SEEDED)]
    moments += [BASE + timedelta(minutes=15)] * TIED
    async with server.services.store.write() as conn:
        for n, moment in enumerate(moments):
            await audit.record(
                conn,
                workspace_id=workspace_id,
                actor_type="user",
                actor_id=None,
                action="seeded.event",
                target_type="thing",
                target_id=None,
                now=moment,
                data={"n": n},
            )


async def listed(
    http: aiohttp.ClientSession, server: RunningServer, path: str, **query: str
) -> dict[str, Any]:
    reply = await call(http, server, "GET", f"{path}?{urlencode(query)}")
    assert reply.status == 200, reply.text
    body: dict[str, Any] = reply.body
    return body


def iso(moment: datetime) -> str:
    return moment.isoformat()


def minutes(body: dict[str, Any]) -> list[int]:
    """The seeded events' minutes after BASE, as listed."""
    return [
        round((datetime.fromisoformat(e["created_at"]) - BASE) / timedelta(minutes=1))
        for e in body["items"]
    ]


@pytest.mark.parametrize("path", PATHS)
async def test_since_and_until_select_a_half_open_range_to_the_microsecond(
    server: RunningServer, http: aiohttp.ClientSession, path: str
) -> None:
    workspace = server.boot.workspace_id if path == PATHS[0] else None
    await seed(server, workspace)
    # [minute 10, minute 20): the ten of them plus the ties at 15, newest first.
    body = await listed(
        http,
        server,
        path,
        since=iso(BASE + timedelta(minutes=10)),
        until=iso(BASE + timedelta(minutes=20)),
        limit="100",
    )
    assert minutes(body) == [19, 18, 17, 16, 15, 15, 15, 15, 14, 13, 12, 11, 10]
    assert body["next_cursor"] is None
    assert {e["action"] for e in body["items"]} == {"seeded.event"}

    # `since` is inclusive and `until` exclusive at the stored microsecond.
    exact = BASE + timedelta(minutes=7)
    assert minutes(await listed(http, server, path, since=iso(exact), until=iso(exact))) == []
    at = await listed(
        http, server, path, since=iso(exact), until=iso(exact + timedelta(microseconds=1))
    )
    assert minutes(at) == [7]
    after = await listed(
        http,
        server,
        path,
        since=iso(exact + timedelta(microseconds=1)),
        until=iso(BASE + timedelta(minutes=9)),
    )
    assert minutes(after) == [8]
    before = await listed(
        http, server, path, since=iso(BASE), until=iso(BASE + timedelta(minutes=2))
    )
    assert minutes(before) == [1, 0]

    # The same instant written with an offset, without one (UTC) and as `Z`.
    berlin = (BASE + timedelta(minutes=28)).astimezone(ZoneInfo("Europe/Berlin"))
    assert berlin.utcoffset() == timedelta(hours=1)
    for since in (
        berlin.isoformat(),
        (BASE + timedelta(minutes=28)).replace(tzinfo=None).isoformat(),
        (BASE + timedelta(minutes=28)).isoformat().replace("+00:00", "Z"),
    ):
        assert minutes(await listed(http, server, path, since=since, action="seeded.event")) == [
            29,
            28,
        ], since

    # A date alone is its midnight (UTC); `until` alone, `since` alone.
    assert (
        minutes(await listed(http, server, path, until="2026-01-10", action="seeded.event")) == []
    )
    everything = await listed(
        http, server, path, since="2026-01-10", action="seeded.event", limit="100"
    )
    assert len(everything["items"]) == SEEDED + TIED
    early = await listed(http, server, path, until=iso(BASE + timedelta(minutes=3)))
    assert minutes(early) == [2, 1, 0]


@pytest.mark.parametrize("path", PATHS)
async def test_keyset_pages_cover_a_time_filtered_set_once(
    server: RunningServer, http: aiohttp.ClientSession, path: str
) -> None:
    workspace = server.boot.workspace_id if path == PATHS[0] else None
    await seed(server, workspace)
    window = {
        "since": (BASE + timedelta(minutes=12)).isoformat(),
        "until": (BASE + timedelta(minutes=18)).isoformat(),
    }
    whole = await listed(http, server, path, limit="100", **window)
    assert minutes(whole) == [17, 16, 15, 15, 15, 15, 14, 13, 12]

    # Pages of 2: the ties at minute 15 straddle page boundaries; no event twice, none lost.
    seen: list[dict[str, Any]] = []
    cursor: str | None = None
    pages = 0
    while True:
        query = {"limit": "2", **window, **({"cursor": cursor} if cursor else {})}
        body = await listed(http, server, path, **query)
        seen += body["items"]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            break
        assert pages < 10
    assert pages == 5
    assert [e["id"] for e in seen] == [e["id"] for e in whole["items"]]

    # A cursor from the filtered set, followed with a narrower range, stays within it.
    first = await listed(http, server, path, limit="3", **window)
    narrower = await listed(
        http,
        server,
        path,
        cursor=first["next_cursor"],
        since=window["since"],
        until=(BASE + timedelta(minutes=15, seconds=1)).isoformat(),
        limit="100",
    )
    assert minutes(first) == [17, 16, 15]
    assert [e["id"] for e in narrower["items"]] == [e["id"] for e in whole["items"][3:]]


BAD_INSTANTS = [
    "yesterday",
    "2026-13-01T00:00:00Z",
    "2026-01-10T25:00:00Z",
    "1767600000",  # seconds since 1970: not an RFC 3339 date-time
    "1767600000.5",
    "",
]
# Valid date-times that leave datetime's range once moved to UTC.
OUT_OF_RANGE = ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"]


@pytest.mark.parametrize("path", PATHS)
async def test_bad_since_or_until_is_a_422_problem_naming_the_field(
    server: RunningServer, http: aiohttp.ClientSession, path: str
) -> None:
    for field in ("since", "until"):
        for value in BAD_INSTANTS + OUT_OF_RANGE:
            reply = await call(http, server, "GET", f"{path}?{urlencode({field: value})}")
            body = problem(reply, 422)
            assert body["type"] == "https://bullpen.dev/problems/validation", (field, value)
            assert [(e["location"], e["field"]) for e in body["errors"]] == [("query", field)], (
                field,
                value,
                body,
            )

    # `until` before `since`: one stable problem naming `until`, with either spelling.
    for since, until in (
        ("2026-01-10T08:00:00Z", "2026-01-10T07:59:59.999999Z"),
        ("2026-01-10T09:00:00+01:00", "2026-01-10T07:59:00"),
        ("2026-01-11", "2026-01-10T23:59:59Z"),
    ):
        reply = await call(
            http, server, "GET", f"{path}?{urlencode({'since': since, 'until': until})}"
        )
        body = problem(reply, 422)
        assert body["type"] == "https://bullpen.dev/problems/validation"
        assert body["detail"] == "until: must not be before since"
        assert body["errors"] == [
            {
                "location": "query",
                "field": "until",
                "message": "must not be before since",
                "code": "range",
            }
        ]
