"""Routines: a cron schedule in a time zone that creates a task for an agent at each slot.

`RoutineService` creates, changes, deletes, reads and fires routines (each change audited in
its own transaction); the `Scheduler` fires the due ones in the background. Any number of
schedulers may run at once (one per worker process): each due routine is claimed by one of them
and every slot is recorded once (see `store/routines.py`).

Slots come from a 5-field cron expression evaluated by cronsim in the routine's IANA time zone,
with Debian cron's rules across DST changes: a time the clock skips fires when it resumes, a
time it repeats fires once. A slot is handled as:

- `created`: a task was queued for the agent;
- `skipped_open`: concurrency `skip`, and the previous fire's task has not ended;
- `skipped_agent`: the agent is paused or terminated;
- `skipped_backlog`: the workspace's queue is full;
- `missed`: the scheduler was not running then, and the catch-up policy does not fire it (one
  row, at the earliest such slot, says how many).

Catch-up after downtime: `skip` fires only a slot at most `ON_TIME` late, `latest` fires the
latest slot passed, `all` fires every slot passed, at most `CATCH_UP_MAX` of them (the latest).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import zoneinfo
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from cronsim import CronSim, CronSimError

from bullpen.domain.access import Permission, need
from bullpen.domain.principal import Principal
from bullpen.domain.records import (
    AgentRecord,
    RoutineFireRecord,
    RoutineRecord,
    RunRecord,
    TaskRecord,
)
from bullpen.domain.status import TERMINAL_TASK, TaskStatus
from bullpen.errors import BullpenError, Conflict, InvalidInput, NotFound
from bullpen.services.enqueue import Admission, unavailable
from bullpen.services.tasks import title_from_prompt
from bullpen.store import agents as agent_store
from bullpen.store import audit
from bullpen.store import routines as routine_store
from bullpen.store import tasks as task_store
from bullpen.store.base import Connection, Store
from bullpen.store.paging import Page

log = logging.getLogger(__name__)

CONCURRENCY = ("skip", "queue")
CATCH_UP = ("skip", "latest", "all")
CREATED, SKIPPED_OPEN, SKIPPED_AGENT = "created", "skipped_open", "skipped_agent"
SKIPPED_BACKLOG, MISSED = "skipped_backlog", "missed"
ROUTINES_MAX = 1000  # per workspace
CATCH_UP_MAX = 100  # slots one catch-up fires at most
FIRES_KEPT = 1000  # per routine; older fires are deleted
ON_TIME = timedelta(seconds=60)  # how late a slot may be handled and still count as on time
SCAN_MAX = 1000  # slots counted one by one after downtime; beyond, only the latest are found
PASS_MAX = 1000  # routines one scheduler pass handles


@functools.cache
def _zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def _invalid(field: str, message: str) -> InvalidInput:
    return InvalidInput(
        f"{field}: {message}",
        errors=[{"location": "body", "field": field, "message": message, "code": field}],
    )


@dataclass(frozen=True, slots=True)
class Due:
    """The slots a routine passed: the latest (oldest first, at most CATCH_UP_MAX), how many
    there were (None: more than SCAN_MAX), and its next slot (None: the schedule has ended)."""

    slots: list[datetime]
    count: int | None
    next: datetime | None


@dataclass(frozen=True, slots=True)
class Schedule:
    """A 5-field cron expression in an IANA time zone."""

    cron: str
    zone: zoneinfo.ZoneInfo

    @classmethod
    def parse(cls, cron: str, timezone: str) -> Schedule:
        """Validate both; InvalidInput naming the field otherwise."""
        if timezone not in _zones():
            raise _invalid(
                "timezone", f"unknown time zone {timezone!r}; use an IANA name like Europe/Berlin"
            )
        fields = cron.split()
        if len(fields) != 5:
            raise _invalid("cron", "5 fields expected: minute hour day-of-month month day-of-week")
        try:
            CronSim(cron, datetime(2000, 1, 1, tzinfo=UTC))
        except CronSimError as err:
            raise _invalid("cron", f"{err} in {cron!r}") from err
        return cls(" ".join(fields), zoneinfo.ZoneInfo(timezone))

    def slots(self, after: datetime) -> Iterator[datetime]:
        """The UTC instants the schedule fires at, strictly after `after`, in order."""
        last = after
        for local in CronSim(self.cron, after.astimezone(self.zone)):
            slot = local.astimezone(UTC)
            if slot > last:  # a wall-clock time that DST repeats fires once
                last = slot
                yield slot

    def after(self, moment: datetime) -> datetime | None:
        """The first slot after `moment`; None if there is none within 50 years."""
        return next(self.slots(moment), None)

    def due(self, first: datetime, now: datetime) -> Due:
        """The slots from `first` (itself a slot) through `now`, and the one after."""
        latest: deque[datetime] = deque([first], maxlen=CATCH_UP_MAX)
        count = 1
        for slot in self.slots(first):
            if slot > now:
                return Due(list(latest), count, slot)
            if count == SCAN_MAX:
                return Due(self._latest_up_to(now), None, self.after(now))
            latest.append(slot)
            count += 1
        return Due(list(latest), count, None)

    def _latest_up_to(self, now: datetime) -> list[datetime]:
        """The latest CATCH_UP_MAX slots up to `now`, oldest first, found backwards from it."""
        found: list[datetime] = []
        # One microsecond on, so cronsim's reverse walk starts at `now` itself (inclusive).
        start = (now + timedelta(microseconds=1)).astimezone(self.zone)
        for local in CronSim(self.cron, start, reverse=True):
            slot = local.astimezone(UTC)
            if slot <= now and (not found or slot < found[-1]):
                found.append(slot)
                if len(found) == CATCH_UP_MAX:
                    break
        return found[::-1]


PREVIEW_SLOTS = 5  # fire times a preview shows


def next_slots(
    cron: str, timezone: str, now: datetime, count: int = PREVIEW_SLOTS
) -> list[datetime]:
    """The schedule's next `count` slots after `now` (UTC); InvalidInput naming the field if
    it is bad or never fires, as a create would say."""
    slots = list(itertools.islice(Schedule.parse(cron, timezone).slots(now), count))
    if not slots:
        raise _invalid("cron", f"{cron!r} never fires")
    return slots


def zones() -> list[str]:
    """Every IANA time zone name a routine may use, sorted."""
    return sorted(_zones())


def first_slot(cron: str, timezone: str, now: datetime) -> datetime:
    """The schedule's first slot after `now`; InvalidInput if it is bad or never fires."""
    first = Schedule.parse(cron, timezone).after(now)
    if first is None:
        raise _invalid("cron", f"{cron!r} never fires")
    return first


async def _queue_task(
    conn: Connection,
    routine: Any,
    slot: datetime,
    now: datetime,
    creator_user_id: UUID | None,
    creator_key_id: UUID | None,
) -> tuple[TaskRecord, RunRecord | None]:
    """Create the routine's task for a claimed slot and link the two (no run when the agent
    requires approval: the task awaits it)."""
    task, run = await task_store.insert_task_with_run(
        conn,
        workspace_id=routine.workspace_id,
        agent_id=routine.agent_id,
        title=routine.title or title_from_prompt(routine.prompt),
        prompt=routine.prompt,
        now=now,
        creator_user_id=creator_user_id,
        creator_key_id=creator_key_id,
        priority=routine.priority,
        labels=list(routine.labels),
    )
    await routine_store.set_fire_task(conn, routine.id, slot, task.id)
    await routine_store.set_last_task(conn, routine.id, task.id)
    return task, run


def _fired(slot: datetime, source: str, task: Any, run: Any) -> dict[str, Any]:
    """The audit data of a fire that created a task."""
    return {
        "slot_at": slot.isoformat(),
        "source": source,
        "task_id": str(task.id),
        "run_id": None if run is None else str(run.id),
    }


class RoutineService:
    """Creates, changes, deletes, reads and fires the routines of the caller's workspace."""

    def __init__(
        self,
        store: Store,
        clock: Callable[[], datetime],
        *,
        on_enqueued: Callable[[], None],
        admission: Admission | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._on_enqueued = on_enqueued
        self._admission = admission or Admission()

    async def list(
        self,
        principal: Principal,
        *,
        limit: int,
        after: tuple[datetime, UUID] | None,
        agent_id: UUID | None = None,
    ) -> Page[RoutineRecord]:
        """A page of the workspace's routines, oldest first."""
        need(principal, Permission.TASKS_READ)
        async with self._store.read() as conn:
            return await routine_store.list_routines(
                conn, principal.workspace_id, limit=limit, after=after, agent_id=agent_id
            )

    async def get(self, principal: Principal, routine_id: UUID) -> RoutineRecord:
        """One routine; another workspace's is NotFound."""
        need(principal, Permission.TASKS_READ)
        async with self._store.read() as conn:
            return await self._routine(conn, principal, routine_id)

    async def create(self, principal: Principal, values: dict[str, Any]) -> RoutineRecord:
        """Create a routine for an agent of the workspace; its first slot is the next one."""
        need(principal, Permission.AGENTS_WRITE)
        _check(values)
        now = self._clock()
        first = first_slot(values["cron"], values["timezone"], now)
        async with self._store.write() as conn:
            await self._agent(conn, principal, values["agent_id"])
            if await routine_store.count_routines(conn, principal.workspace_id) >= ROUTINES_MAX:
                raise Conflict(f"a workspace has at most {ROUTINES_MAX} routines")
            stored = {
                **values,
                "workspace_id": principal.workspace_id,
                "next_fire_at": first if values["enabled"] else None,
                "creator_user_id": principal.user_id,
                "creator_key_id": principal.api_key_id,
            }
            routine_id = await routine_store.create_routine(conn, stored, now)
            await audit.record_by(
                conn,
                principal,
                "routine.create",
                "routine",
                routine_id,
                now,
                {k: _plain(v) for k, v in values.items()},
            )
            return await self._routine(conn, principal, routine_id)

    async def update(
        self, principal: Principal, routine_id: UUID, changes: dict[str, Any]
    ) -> RoutineRecord:
        """Change any of a routine's settings; a new schedule or enabling it restarts its slots
        from now (slots passed while it was disabled are not caught up)."""
        need(principal, Permission.AGENTS_WRITE)
        settable = routine_store.UPDATABLE - {"next_fire_at"}
        if not changes.keys() <= settable:
            raise InvalidInput(f"only {sorted(settable)} may be changed")
        _check(changes)
        now = self._clock()
        async with self._store.write() as conn:
            before = await self._routine(conn, principal, routine_id)
            changed = {k: v for k, v in changes.items() if getattr(before, k) != v}
            if not changed:
                return before
            if "agent_id" in changed:
                await self._agent(conn, principal, changed["agent_id"])
            if changed.keys() & {"cron", "timezone", "enabled"}:
                merged = {k: changed.get(k, getattr(before, k)) for k in ("cron", "timezone")}
                first = first_slot(merged["cron"], merged["timezone"], now)
                enabled = changed.get("enabled", before.enabled)
                changed["next_fire_at"] = first if enabled else None
            await routine_store.update_routine(
                conn, principal.workspace_id, routine_id, changed, now
            )
            await audit.record_by(
                conn,
                principal,
                "routine.update",
                "routine",
                routine_id,
                now,
                {
                    "before": {k: _plain(getattr(before, k)) for k in changed},
                    "after": {k: _plain(v) for k, v in changed.items()},
                },
            )
            return await self._routine(conn, principal, routine_id)

    async def delete(self, principal: Principal, routine_id: UUID) -> None:
        """Delete a routine and its fires (the tasks it created stay)."""
        need(principal, Permission.AGENTS_WRITE)
        now = self._clock()
        async with self._store.write() as conn:
            routine = await self._routine(conn, principal, routine_id)
            await routine_store.delete_routine(conn, principal.workspace_id, routine_id)
            await audit.record_by(
                conn,
                principal,
                "routine.delete",
                "routine",
                routine_id,
                now,
                {"name": routine.name, "agent_id": str(routine.agent_id)},
            )

    async def fire(self, principal: Principal, routine_id: UUID) -> RoutineFireRecord:
        """Create the routine's task now, whatever its schedule, `enabled` and concurrency
        policy; returns the fire. A paused agent is Conflict, a full queue RateLimited."""
        need(principal, Permission.TASKS_WRITE)
        now = self._clock()
        async with self._store.write() as conn:
            routine = await self._routine(conn, principal, routine_id)
            await self._admission.agent(
                conn, principal.workspace_id, routine.agent_id, terminated=False
            )
            await self._admission.check_backlog(conn, principal.workspace_id)
            if not await routine_store.claim_slot(
                conn,
                routine_id=routine.id,
                workspace_id=routine.workspace_id,
                slot_at=now,
                source="manual",
                outcome=CREATED,
                detail=None,
                now=now,
            ):
                raise Conflict("the routine was fired at this very instant; retry")
            task, run = await _queue_task(
                conn, routine, now, now, principal.user_id, principal.api_key_id
            )
            await audit.record_by(
                conn,
                principal,
                "routine.fire",
                "routine",
                routine.id,
                now,
                _fired(now, "manual", task, run),
            )
            self._store.after_commit(self._on_enqueued)
            return await routine_store.get_fire(conn, routine.id, now)

    async def fires(
        self,
        principal: Principal,
        routine_id: UUID,
        *,
        limit: int,
        after: tuple[datetime, UUID] | None,
    ) -> Page[RoutineFireRecord]:
        """A page of the routine's fires, latest slot first."""
        need(principal, Permission.TASKS_READ)
        async with self._store.read() as conn:
            await self._routine(conn, principal, routine_id)
            return await routine_store.list_fires(conn, routine_id, limit=limit, after=after)

    async def _routine(
        self, conn: Connection, principal: Principal, routine_id: UUID
    ) -> RoutineRecord:
        routine = await routine_store.get_routine(conn, principal.workspace_id, routine_id)
        if routine is None:
            raise NotFound("no such routine")
        return routine

    async def _agent(self, conn: Connection, principal: Principal, agent_id: UUID) -> AgentRecord:
        agent = await agent_store.get_agent(conn, principal.workspace_id, agent_id)
        if agent is None:
            raise NotFound("no such agent in this workspace")
        return agent


def _check(values: dict[str, Any]) -> None:
    for field, allowed in (("concurrency", CONCURRENCY), ("catch_up", CATCH_UP)):
        if field in values and values[field] not in allowed:
            raise _invalid(field, f"one of {list(allowed)}")


def _plain(value: Any) -> Any:
    """A value as audit data stores it (JSON)."""
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return value


class _Gate:
    """Whether a routine's next slot may create a task: its agent, its last task, the queue."""

    def __init__(self, conn: Connection, routine: Any, agent: Any, admission: Admission) -> None:
        self._conn = conn
        self._routine = routine
        self._agent = agent
        self._admission = admission
        self._last_task_id: UUID | None = routine.last_task_id
        self._waiting: int | None = None

    async def outcome(self) -> tuple[str, str | None]:
        """CREATED, or why the slot is skipped."""
        status = unavailable(self._agent)
        if status is not None:
            return SKIPPED_AGENT, f"agent {self._agent.name!r} is {status}"
        if self._routine.concurrency == "skip" and self._last_task_id is not None:
            last = await task_store.get_task(
                self._conn, self._routine.workspace_id, self._last_task_id
            )
            if last is not None and TaskStatus(last.status) not in TERMINAL_TASK:
                return (
                    SKIPPED_OPEN,
                    f"the previous task {last.task_key}-{last.number} is still {last.status}",
                )
        if self._waiting is None:
            self._waiting = await self._admission.waiting(self._conn, self._routine.workspace_id)
        if self._admission.full(self._waiting):
            return SKIPPED_BACKLOG, self._admission.full_message(subject="the workspace")
        return CREATED, None

    def created(self, task_id: UUID) -> None:
        """A task was queued for the slot just checked."""
        self._last_task_id = task_id
        self._waiting = (self._waiting or 0) + 1


class Scheduler:
    """Fires the routines due, every `interval_s` while open."""

    def __init__(
        self,
        store: Store,
        clock: Callable[[], datetime],
        *,
        interval_s: float,
        on_enqueued: Callable[[], None],
        admission: Admission | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._interval = interval_s
        self._on_enqueued = on_enqueued
        self._admission = admission or Admission()
        # A slow pass must not turn every slot into a missed one.
        self._on_time = max(ON_TIME, timedelta(seconds=2 * interval_s))
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Scheduler:
        self._task = asyncio.create_task(self._loop(), name="bullpen-scheduler")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def run_once(self) -> int:
        """Handle every routine due now, each in its own transaction; returns tasks created.

        A routine that fails is logged and left for the next pass, so it cannot hold up the
        others.
        """
        now = self._clock()
        async with self._store.read() as conn:  # idle passes take no write lock
            if not await routine_store.any_due(conn, now):
                return 0
        failed: list[UUID] = []
        created = 0
        for _ in range(PASS_MAX):
            claimed: UUID | None = None
            try:
                async with self._store.write() as conn:
                    routine = await routine_store.claim_due(conn, now, failed)
                    if routine is None:
                        break
                    claimed = routine.id
                    created += await self.fire_due(conn, routine, now)
            except Exception:
                if claimed is None:
                    raise
                log.exception("routine %s could not fire; it is retried next pass", claimed)
                failed.append(claimed)
            await asyncio.sleep(0)  # let requests in between routines
        return created

    async def fire_due(self, conn: Connection, routine: Any, now: datetime) -> int:
        """Handle the slots a claimed routine passed up to `now`, and move it on to its next;
        returns the tasks created (none if another scheduler moved it on meanwhile)."""
        claimed_at: datetime = routine.next_fire_at
        due = Schedule(routine.cron, zoneinfo.ZoneInfo(routine.timezone)).due(claimed_at, now)
        if not await routine_store.advance(conn, routine.id, claimed_at, due.next):
            return 0
        fire = self._catch_up(routine.catch_up, due, now)
        missed = None if due.count is None else due.count - len(fire)
        if missed != 0:
            many = f"{missed}" if missed is not None else f"more than {SCAN_MAX}"
            await self._claim(
                conn,
                routine,
                claimed_at,
                MISSED,
                f"{many} slots from this one on passed while no scheduler ran; "
                f"catch-up `{routine.catch_up}` did not fire them",
                now,
            )
        agent = await agent_store.get_agent(conn, routine.workspace_id, routine.agent_id)
        gate = _Gate(conn, routine, agent, self._admission)
        created = 0
        for slot in fire:
            outcome, detail = await gate.outcome()
            if not await self._claim(conn, routine, slot, outcome, detail, now):
                continue  # recorded already: never fire a slot twice
            if outcome != CREATED:
                continue
            task, run = await _queue_task(
                conn, routine, slot, now, routine.creator_user_id, routine.creator_key_id
            )
            gate.created(task.id)
            await audit.record(
                conn,
                workspace_id=routine.workspace_id,
                actor_type="system",
                actor_id=None,
                action="routine.fire",
                target_type="routine",
                target_id=routine.id,
                now=now,
                data=_fired(slot, "schedule", task, run),
            )
            created += 1
        await routine_store.prune_fires(conn, routine.id, FIRES_KEPT)
        if created:
            self._store.after_commit(self._on_enqueued)
        return created

    def _catch_up(self, policy: str, due: Due, now: datetime) -> Sequence[datetime]:
        """Which of the passed slots to fire."""
        if policy == "all":
            return due.slots
        if policy == "latest" or now - due.slots[-1] <= self._on_time:
            return due.slots[-1:]
        return []

    async def _claim(
        self,
        conn: Connection,
        routine: Any,
        slot: datetime,
        outcome: str,
        detail: str | None,
        now: datetime,
    ) -> bool:
        return await routine_store.claim_slot(
            conn,
            routine_id=routine.id,
            workspace_id=routine.workspace_id,
            slot_at=slot,
            source="schedule",
            outcome=outcome,
            detail=detail,
            now=now,
        )

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                created = await self.run_once()
            except BullpenError as err:  # the database is away: try again next interval
                log.warning("scheduler pass failed: %s", err.detail)
                continue
            except Exception:
                log.exception("scheduler pass failed")
                continue
            if created:
                log.info("routines created %d tasks", created)
