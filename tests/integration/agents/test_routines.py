"""Routines on both backends: slots across DST, two schedulers never firing a slot twice,
catch-up after a gap, concurrency policies, and the API (validation, tenancy, audit, wiring)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

import aiohttp
import pytest
import sqlalchemy as sa

from bullpen.domain.access import ROLE_PERMISSIONS
from bullpen.domain.principal import Principal, Role
from bullpen.errors import InvalidInput
from bullpen.services.enqueue import Admission
from bullpen.services.routines import (
    CATCH_UP_MAX,
    SCAN_MAX,
    RoutineService,
    Schedule,
    Scheduler,
    first_slot,
)
from bullpen.settings import Settings
from bullpen.store import agents as agent_store
from bullpen.store import routines as routine_store
from bullpen.store.base import Store
from bullpen.store.engine import create_store
from bullpen.store.tables import agents, audit_events, routine_fires, routines, tasks
from tests.support.db import audits, count, rows
from tests.support.http import bearer, call, problem
from tests.support.seed import other_workspace, workspace_with_agent
from tests.support.servers import RunningServer

PROMPT = "Analyze this dataset and extract key metrics"
T0 = datetime(2026, 3, 2, 10, 0, 30, tzinfo=UTC)  # a Monday, 30 s past the hour


def at(text: str) -> datetime:
    """A UTC instant from `YYYY-MM-DD HH:MM`."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


# ---- slots ---------------------------------------------------------------------------------


def test_slots_keep_the_wall_clock_across_dst() -> None:
    daily = Schedule.parse("30 2 * * *", "Europe/Berlin")
    # Spring forward: 02:30 does not exist on 29 March, so it fires when the clock resumes.
    assert list(islice(daily.slots(at("2026-03-27 12:00")), 3)) == [
        at("2026-03-28 01:30"),  # 02:30 CET
        at("2026-03-29 01:00"),  # 03:00 CEST
        at("2026-03-30 00:30"),  # 02:30 CEST
    ]
    # Fall back: 02:30 happens twice on 25 October and fires once.
    assert list(islice(daily.slots(at("2026-10-23 12:00")), 3)) == [
        at("2026-10-24 00:30"),
        at("2026-10-25 00:30"),
        at("2026-10-26 01:30"),
    ]
    nine = Schedule.parse("0 9 * * MON-FRI", "Europe/Berlin")
    assert list(islice(nine.slots(at("2026-03-26 12:00")), 3)) == [
        at("2026-03-27 08:00"),  # Friday, CET
        at("2026-03-30 07:00"),  # Monday, CEST: still 09:00 in Berlin
        at("2026-03-31 07:00"),
    ]
    hourly = Schedule.parse("0 * * * *", "Europe/Berlin")
    assert list(islice(hourly.slots(at("2026-10-24 22:30")), 4)) == [
        at("2026-10-24 23:00"),
        at("2026-10-25 00:00"),
        at("2026-10-25 01:00"),  # 02:00 CET, the repeated hour: every real hour fires once
        at("2026-10-25 02:00"),
    ]


@pytest.mark.parametrize(
    ("cron", "timezone", "field"),
    [
        ("* * * *", "UTC", "cron"),
        ("0 * * * * *", "UTC", "cron"),  # seconds: at most one fire a minute
        ("61 * * * *", "UTC", "cron"),
        ("0 0 30 2 *", "UTC", "cron"),
        ("0 9 * * FUNDAY", "UTC", "cron"),
        ("0 0 */10 * 1#4", "UTC", "cron"),  # days 1, 11, 21, 31 that are 4th Mondays: never
        ("0 9 * * *", "Mars/Olympus", "timezone"),
        ("0 9 * * *", "../../etc/passwd", "timezone"),
    ],
)
def test_bad_schedules_are_refused(cron: str, timezone: str, field: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        first_slot(cron, timezone, T0)
    assert refused.value.errors is not None and refused.value.errors[0]["field"] == field


# ---- the scheduler against a real store ---------------------------------------------------


class Clock:
    """A clock the test moves."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


def owner(ws: UUID) -> Principal:
    """The workspace's owner, as the services see a caller."""
    return Principal(ws, None, None, Role.OWNER, "api_key", ROLE_PERMISSIONS[Role.OWNER])


async def new_routine(
    store: Store, clock: Clock, ws: UUID, agent: UUID, name: str = "r", **values: Any
) -> Any:
    """Create a routine through the service (hourly, queue, catch-up all unless changed)."""
    service = RoutineService(store, clock, on_enqueued=lambda: None)
    fields = {
        "name": name,
        "agent_id": agent,
        "cron": "0 * * * *",
        "timezone": "UTC",
        "prompt": PROMPT,
        "title": None,
        "priority": 0,
        "labels": [],
        "concurrency": "queue",
        "catch_up": "all",
        "enabled": True,
    }
    return await service.create(owner(ws), {**fields, **values})


def scheduler(store: Store, clock: Clock, max_backlog: int = 10_000) -> Scheduler:
    """A scheduler whose passes the test runs (its loop is never entered)."""
    return Scheduler(
        store,
        clock,
        interval_s=1.0,
        on_enqueued=lambda: None,
        admission=Admission(max_backlog=max_backlog),
    )


async def fires_of(store: Store, routine_id: UUID) -> list[Any]:
    """The routine's fires, oldest slot first."""
    async with store.read() as conn:
        query = (
            sa.select(routine_fires)
            .where(routine_fires.c.routine_id == routine_id)
            .order_by(routine_fires.c.slot_at)
        )
        return list(await conn.execute(query))


async def routine_row(store: Store, routine_id: UUID) -> Any:
    async with store.read() as conn:
        return (await conn.execute(sa.select(routines).where(routines.c.id == routine_id))).one()


async def task_count(store: Store) -> int:
    async with store.read() as conn:
        return int((await conn.execute(sa.select(sa.func.count()).select_from(tasks))).scalar())


@pytest.fixture
async def second_store(settings: Settings) -> AsyncIterator[Store]:
    """Another store (its own engine and pool) on the same database, as a second process has."""
    other = create_store(settings)
    try:
        yield other
    finally:
        await other.close()


async def test_two_schedulers_never_fire_a_slot_twice(store: Store, second_store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    clock = Clock(T0)
    made = [
        await new_routine(store, clock, ws, agent, name=f"r{i}", cron="* * * * *") for i in range(4)
    ]
    one, two = scheduler(store, clock), scheduler(second_store, clock)
    steps = 30
    created = [0, 0]
    for _ in range(steps):
        clock.advance(minutes=1)
        for i, made_now in enumerate(await asyncio.gather(one.run_once(), two.run_once())):
            created[i] += made_now

    assert sum(created) == steps * len(made)
    assert min(created) > 0, created  # they did race: each fired some of the slots
    assert await task_count(store) == steps * len(made)
    start = T0.replace(second=0) + timedelta(minutes=1)
    expected = [start + timedelta(minutes=i) for i in range(steps)]
    for routine in made:
        fired = await fires_of(store, routine.id)
        assert [f.slot_at for f in fired] == expected
        assert {f.outcome for f in fired} == {"created"}
        assert len({f.task_id for f in fired}) == steps
        assert (await routine_row(store, routine.id)).next_fire_at == expected[-1] + timedelta(
            minutes=1
        )


async def test_a_slot_is_claimed_once_and_a_stale_claim_fires_nothing(
    store: Store, second_store: Store
) -> None:
    ws, agent = await workspace_with_agent(store)
    clock = Clock(T0)
    routine = await new_routine(store, clock, ws, agent)
    slot = routine.next_fire_at
    claims = []
    for each in (store, second_store):  # the primary key, whatever the routine row says
        async with each.write() as conn:
            claims.append(
                await routine_store.claim_slot(
                    conn,
                    routine_id=routine.id,
                    workspace_id=ws,
                    slot_at=slot,
                    source="schedule",
                    outcome="skipped_open",
                    detail=None,
                    now=clock(),
                )
            )
    assert claims == [True, False]

    clock.now = slot + timedelta(seconds=1)
    stale = await routine_row(store, routine.id)
    assert await scheduler(store, clock).run_once() == 0  # its slot was already recorded
    assert await task_count(store) == 0
    clock.advance(hours=1)
    assert await scheduler(store, clock).run_once() == 1
    async with second_store.write() as conn:  # a scheduler that read the routine before
        assert await scheduler(second_store, clock).fire_due(conn, stale, clock()) == 0
        assert not await routine_store.advance(conn, routine.id, slot, clock())
    assert await task_count(store) == 1


@pytest.mark.parametrize(
    ("policy", "fired", "missed"),
    [
        ("skip", [], "5 slots"),
        ("latest", ["15:00"], "4 slots"),
        ("all", ["11:00", "12:00", "13:00", "14:00", "15:00"], None),
    ],
)
async def test_catch_up_after_a_gap(
    store: Store, policy: str, fired: list[str], missed: str | None
) -> None:
    ws, agent = await workspace_with_agent(store)
    clock = Clock(T0)
    routine = await new_routine(store, clock, ws, agent, catch_up=policy)
    assert routine.next_fire_at == at("2026-03-02 11:00")

    clock.now = at("2026-03-02 15:30")  # no scheduler ran at 11:00 … 15:00
    assert await scheduler(store, clock).run_once() == len(fired)
    rows_ = await fires_of(store, routine.id)
    created = [f for f in rows_ if f.outcome == "created"]
    assert [f"{f.slot_at:%H:%M}" for f in created] == fired
    assert all(f.task_id is not None for f in created)
    lost = [f for f in rows_ if f.outcome == "missed"]
    if missed is None:
        assert lost == []
    else:
        assert [f.slot_at for f in lost] == [at("2026-03-02 11:00")]
        assert lost[0].detail.startswith(missed) and f"`{policy}`" in lost[0].detail
        assert lost[0].task_id is None
    assert await task_count(store) == len(fired)
    assert (await routine_row(store, routine.id)).next_fire_at == at("2026-03-02 16:00")

    clock.now = at("2026-03-02 16:00") + timedelta(seconds=20)  # back on time: every policy
    assert await scheduler(store, clock).run_once() == 1
    assert await scheduler(store, clock).run_once() == 0


async def test_catch_up_is_bounded_after_a_long_gap(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    clock = Clock(T0)
    every = await new_routine(store, clock, ws, agent, name="every", cron="* * * * *")
    latest = await new_routine(
        store, clock, ws, agent, name="latest", cron="* * * * *", catch_up="latest"
    )
    first = every.next_fire_at
    clock.now = first + timedelta(minutes=SCAN_MAX + 500, seconds=10)  # beyond the count too

    assert await scheduler(store, clock).run_once() == CATCH_UP_MAX + 1
    last_slot = first + timedelta(minutes=SCAN_MAX + 500)
    for routine, fired in ((every, CATCH_UP_MAX), (latest, 1)):
        rows_ = await fires_of(store, routine.id)
        assert rows_[0].outcome == "missed" and rows_[0].slot_at == first
        assert rows_[0].detail.startswith(f"more than {SCAN_MAX} slots")
        created = [f.slot_at for f in rows_ if f.outcome == "created"]
        assert created == [last_slot - timedelta(minutes=i) for i in reversed(range(fired))]
        assert (await routine_row(store, routine.id)).next_fire_at == last_slot + timedelta(
            minutes=1
        )

    service = RoutineService(store, clock, on_enqueued=lambda: None)
    page = await service.fires(owner(ws), every.id, limit=60, after=None)
    rest = await service.fires(owner(ws), every.id, limit=60, after=page.next_after)
    listed = [f.slot_at for f in [*page.rows, *rest.rows]]
    assert listed == sorted(listed, reverse=True) and len(listed) == CATCH_UP_MAX + 1
    assert rest.next_after is None

    clock.now = (await routine_row(store, every.id)).next_fire_at + timedelta(minutes=149)
    assert await scheduler(store, clock).run_once() == CATCH_UP_MAX + 1
    rows_ = await fires_of(store, every.id)
    assert [f.detail for f in rows_ if f.outcome == "missed"][-1].startswith(
        f"{150 - CATCH_UP_MAX} slots"
    )


@pytest.mark.parametrize("policy", ["skip", "queue"])
async def test_concurrency_skip_waits_for_the_previous_task(store: Store, policy: str) -> None:
    ws, agent = await workspace_with_agent(store)
    clock = Clock(T0)
    routine = await new_routine(store, clock, ws, agent, concurrency=policy)
    one = scheduler(store, clock)
    for _ in range(3):  # nothing runs the tasks: the first is still queued
        clock.now = (await routine_row(store, routine.id)).next_fire_at + timedelta(seconds=5)
        await one.run_once()
    rows_ = await fires_of(store, routine.id)
    if policy == "queue":
        assert [f.outcome for f in rows_] == ["created"] * 3
        return
    assert [f.outcome for f in rows_] == ["created", "skipped_open", "skipped_open"]
    assert rows_[1].detail == "the previous task T-1 is still queued"
    assert await task_count(store) == 1

    async with store.write() as conn:
        await conn.execute(tasks.update().values(status="done"))
    clock.now = (await routine_row(store, routine.id)).next_fire_at + timedelta(seconds=5)
    assert await one.run_once() == 1
    last = (await fires_of(store, routine.id))[-1]
    assert last.outcome == "created"
    assert (await routine_row(store, routine.id)).last_task_id == last.task_id


async def test_a_paused_agent_or_a_full_queue_skips_the_slot(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    clock = Clock(T0)
    routine = await new_routine(store, clock, ws, agent)
    async with store.write() as conn:
        await conn.execute(agents.update().values(status="paused"))
    clock.now = routine.next_fire_at
    assert await scheduler(store, clock).run_once() == 0
    async with store.write() as conn:
        await conn.execute(agents.update().values(status="active"))
    clock.advance(hours=1)
    assert await scheduler(store, clock).run_once() == 1  # the queue now holds one run
    clock.advance(hours=1)
    assert await scheduler(store, clock, max_backlog=1).run_once() == 0
    rows_ = await fires_of(store, routine.id)
    assert [(f.outcome, f.detail) for f in rows_] == [
        ("skipped_agent", "agent 'a' is paused"),
        ("created", None),
        ("skipped_backlog", "the workspace already has 1 runs waiting in the queue"),
    ]
    assert await task_count(store) == 1


async def test_a_disabled_routine_does_not_fire(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    clock = Clock(T0)
    routine = await new_routine(store, clock, ws, agent, enabled=False)
    assert routine.next_fire_at is None
    clock.advance(days=2)
    assert await scheduler(store, clock).run_once() == 0
    assert await fires_of(store, routine.id) == []


# ---- the API -------------------------------------------------------------------------------

YEARLY = {"cron": "0 0 1 1 *", "timezone": "Europe/Berlin"}  # one slot a year: none in a test


def new_year_in_berlin(now: datetime) -> datetime:
    """The next midnight of 1 January in Berlin, in UTC (computed without cron)."""
    berlin = now.astimezone(ZoneInfo("Europe/Berlin"))
    return datetime(berlin.year + 1, 1, 1, tzinfo=ZoneInfo("Europe/Berlin")).astimezone(UTC)


def when(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


async def test_create_read_change_fire_and_delete(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    agent = str(server.boot.agent_id)
    body = {
        "name": "metrics",
        "agent_id": agent,
        **YEARLY,
        "prompt": PROMPT,
        "title": "Yearly metrics",
        "priority": 3,
        "labels": ["yearly"],
    }
    headers = {**server.auth, "Idempotency-Key": "routine-1"}
    created = await call(http, server, "POST", "/api/v1/routines", headers, body)
    routine = created.body
    assert created.status == 201, routine
    assert created.headers["Location"] == f"/api/v1/routines/{routine['id']}"
    assert routine["concurrency"] == "skip" and routine["catch_up"] == "latest"
    assert routine["enabled"] is True and routine["last_task_id"] is None
    assert when(routine["next_fire_at"]) == new_year_in_berlin(server.services.clock())
    again = await call(http, server, "POST", "/api/v1/routines", headers, body)
    assert again.status == 201 and again.body == routine
    assert await count(server, routines) == 1

    path = f"/api/v1/routines/{routine['id']}"
    assert (await call(http, server, "GET", path)).body == routine
    second = await call(http, server, "POST", "/api/v1/routines", body={**body, "name": "second"})
    page = await call(http, server, "GET", "/api/v1/routines?limit=1")
    assert [r["name"] for r in page.body["items"]] == ["metrics"]
    rest = await call(http, server, "GET", f"/api/v1/routines?cursor={page.body['next_cursor']}")
    assert [r["name"] for r in rest.body["items"]] == ["second"] and not rest.body["next_cursor"]
    other_agent = await call(http, server, "GET", f"/api/v1/routines?agent_id={routine['id']}")
    assert other_agent.body["items"] == []

    off = await call(http, server, "PATCH", path, body={"enabled": False})
    assert off.status == 200 and off.body["next_fire_at"] is None
    changed = await call(
        http, server, "PATCH", path, body={"enabled": True, "cron": "0 0 1 1 *", "timezone": "UTC"}
    )
    assert changed.status == 200, changed.body
    assert changed.body["cron"] == "0 0 1 1 *"
    year = server.services.clock().year + 1
    assert when(changed.body["next_fire_at"]) == datetime(year, 1, 1, tzinfo=UTC)

    fired = await call(
        http, server, "POST", f"{path}/fire", {**server.auth, "Idempotency-Key": "f"}
    )
    assert fired.status == 201, fired.body
    assert fired.body["source"] == "manual" and fired.body["outcome"] == "created"
    replay = await call(
        http, server, "POST", f"{path}/fire", {**server.auth, "Idempotency-Key": "f"}
    )
    assert replay.body == fired.body
    task = await call(http, server, "GET", fired.headers["Location"])
    assert task.status == 200 and task.body["id"] == fired.body["task_id"]
    assert (task.body["title"], task.body["prompt"]) == ("Yearly metrics", PROMPT)
    assert (task.body["priority"], task.body["labels"]) == (3, ["yearly"])
    assert task.body["agent_id"] == agent
    listed = await call(http, server, "GET", f"{path}/fires")
    assert listed.body == {"items": [fired.body], "next_cursor": None}
    got = await call(http, server, "GET", path)
    assert got.body["last_task_id"] == fired.body["task_id"]

    assert (await call(http, server, "DELETE", path)).status == 204
    assert (await call(http, server, "GET", path)).status == 404
    assert (await call(http, server, "GET", fired.headers["Location"])).status == 200
    assert await count(server, routine_fires) == 0

    actions = {
        "routine.create": [routine["id"], second.body["id"]],
        "routine.update": [routine["id"], routine["id"]],
        "routine.fire": [routine["id"]],
        "routine.delete": [routine["id"]],
    }
    for action, targets in actions.items():
        events = await audits(server, action)
        assert [str(e.target_id) for e in events] == targets, action
        assert all(e.actor_type == "api_key" for e in events)
    update = (await audits(server, "routine.update"))[1].data
    assert update["before"] == {
        "enabled": False,
        "timezone": "Europe/Berlin",
        "next_fire_at": None,
    }
    assert update["after"]["timezone"] == "UTC" and "cron" not in update["after"]  # same cron
    assert (await audits(server, "routine.fire"))[0].data["task_id"] == fired.body["task_id"]


BAD_BODIES: list[tuple[dict[str, Any], str]] = [
    ({"cron": "0 9 * *"}, "cron"),
    ({"cron": "*/20 * * * * *"}, "cron"),
    ({"cron": "0 25 * * *"}, "cron"),
    ({"cron": "0 0 */10 * 1#4"}, "cron"),
    ({"cron": "0 9 * * *\n"}, "cron"),
    ({"cron": "0  9 * * *"}, "cron"),
    ({"timezone": "Europe/Atlantis"}, "timezone"),
    ({"timezone": "utc"}, "timezone"),
    ({"concurrency": "sometimes"}, "concurrency"),
    ({"catch_up": "most"}, "catch_up"),
    ({"enabled": "yes"}, "enabled"),
    ({"prompt": "short"}, "prompt"),
    ({"name": ""}, "name"),
    ({"next_fire_at": "2026-01-01T00:00:00Z"}, "next_fire_at"),
]


async def test_bad_input_and_other_workspaces(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    svc = server.services
    async with svc.store.write() as conn:
        other, _, their_key = await other_workspace(conn, secret=svc.secret, now=svc.clock())
        theirs = await agent_store.create_agent(
            conn,
            workspace_id=other,
            name="theirs",
            title="",
            adapter="llm",
            config={"provider": "simulated", "model": "sim-1"},
            now=svc.clock(),
        )
    good = {"name": "mine", "agent_id": str(server.boot.agent_id), **YEARLY, "prompt": PROMPT}
    for changes, field in BAD_BODIES:
        refused = problem(
            await call(http, server, "POST", "/api/v1/routines", body={**good, **changes}), 422
        )
        assert refused["type"] == "https://bullpen.dev/problems/validation"
        assert any(str(e["field"]).endswith(field) for e in refused["errors"]), (changes, refused)
    assert await count(server, routines) == 0
    unknown = await call(
        http, server, "POST", "/api/v1/routines", body={**good, "agent_id": str(theirs)}
    )
    problem(unknown, 404)

    mine = (await call(http, server, "POST", "/api/v1/routines", body=good)).body
    problem(await call(http, server, "POST", "/api/v1/routines", body=good), 409)
    path = f"/api/v1/routines/{mine['id']}"
    for changes, field in [*BAD_BODIES, ({"cron": None}, "cron")]:
        refused = problem(await call(http, server, "PATCH", path, body=changes), 422)
        assert any(str(e["field"]).endswith(field) for e in refused["errors"]), (changes, refused)
    problem(await call(http, server, "PATCH", path, body={"agent_id": str(theirs)}), 404)
    assert (await call(http, server, "GET", path)).body == mine

    they = bearer(their_key)
    for method, route in [
        ("GET", path),
        ("PATCH", path),
        ("DELETE", path),
        ("GET", f"{path}/fires"),
        ("POST", f"{path}/fire"),
    ]:
        body = {"title": "theirs now"} if method == "PATCH" else None
        problem(await call(http, server, method, route, they, body), 404)
    listed = await call(http, server, "GET", "/api/v1/routines", they)
    assert listed.status == 200 and listed.body["items"] == []
    assert (await call(http, server, "GET", path)).body == mine
    assert await count(server, tasks) == 0

    async with svc.store.write() as conn:
        await conn.execute(agents.update().values(status="paused"))
    problem(await call(http, server, "POST", f"{path}/fire"), 409)
    assert await count(server, routine_fires) == 0


async def test_the_server_runs_a_scheduler(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    created = await call(
        http,
        server,
        "POST",
        "/api/v1/routines",
        body={"name": "now", "agent_id": str(server.boot.agent_id), **YEARLY, "prompt": PROMPT},
    )
    routine_id = UUID(created.body["id"])
    slot = server.services.clock() - timedelta(seconds=1)
    async with server.services.store.write() as conn:  # as if its slot had just come
        await conn.execute(
            routines.update().where(routines.c.id == routine_id).values(next_fire_at=slot)
        )
    path = f"/api/v1/routines/{routine_id}"
    for _ in range(100):
        fires = (await call(http, server, "GET", f"{path}/fires")).body["items"]
        if fires:
            break
        await asyncio.sleep(0.1)
    assert [(f["source"], f["outcome"]) for f in fires] == [("schedule", "created")]
    assert when(fires[0]["slot_at"]) == slot
    got = (await call(http, server, "GET", path)).body
    assert when(got["next_fire_at"]) == new_year_in_berlin(server.services.clock())
    for _ in range(100):  # the worker runs the task it queued
        task = (await call(http, server, "GET", f"/api/v1/tasks/{fires[0]['task_id']}")).body
        if task["status"] == "done":
            break
        await asyncio.sleep(0.1)
    assert task["status"] == "done", task
    fired = await rows(
        server, sa.select(audit_events).where(audit_events.c.action == "routine.fire")
    )
    assert [(e.actor_type, str(e.target_id)) for e in fired] == [("system", str(routine_id))]
    assert fired[0].data["task_id"] == task["id"]
