"""Tasks and the first run each is enqueued with (one transaction, no dual write)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy import exc

from bullpen.domain.agents import AgentStatus
from bullpen.domain.approvals import ApprovalKind, Outcome
from bullpen.domain.records import CommentRecord, RunRecord, TaskRecord
from bullpen.domain.status import RunStatus, TaskStatus, task_sources
from bullpen.domain.trace import TRACE_PARENT
from bullpen.errors import Conflict
from bullpen.store import approvals as approval_store
from bullpen.store.base import UNWATCHED, Connection, Store
from bullpen.store.ids import time_ordered_id
from bullpen.store.paging import Page, keyset
from bullpen.store.tables import agents, audit_events, runs, task_comments, tasks, workspaces

_TASK_COLUMNS = [*tasks.c, workspaces.c.task_key]


_RUN_FIELDS = (
    "id",
    "workspace_id",
    "task_id",
    "agent_id",
    "status",
    "attempt",
    "priority",
    "failures",
    "queued_at",
    "trace_parent",
)
_INSERT_TASK = tasks.insert()
_INSERT_RUN = runs.insert()
_INSERT_AUDIT = audit_events.insert()
# The workspace's counter. On PostgreSQL its row stays locked from the increment to the commit,
# so a workspace's creates take their numbers one at a time. A sequence per workspace (issue 21,
# migrations 0011 and 0012) let them all run at once, and the reference scenario got worse, not
# better: at 80 users the time added to the first token went from 27 to 160 ms on average, the
# pool from 20 to 100 % (docs/benchmarks/history.md). The one statement that increments also
# inserts, so the lock is held for that statement and the commit only. Committing that
# statement by itself (autocommit, no BEGIN/COMMIT) was tried too (ninth session): fewer round
# trips and less CPU per create, but at 80 users the pool filled and the time added to the
# first token doubled, so creates keep their transaction.
_NEXT_NUMBER = (
    workspaces.update()
    .where(workspaces.c.id == sa.bindparam("workspace_id"))
    .values(task_counter=workspaces.c.task_counter + 1)
    .returning(workspaces.c.task_counter.label("number"), workspaces.c.task_key)
    .execution_options(**{UNWATCHED: True})
)


def _task_and_run_at_once(*, audited: bool) -> sa.Select[Any]:
    """PostgreSQL: take the number and insert the task and its run in one statement, and the
    audit event of the create with them when `audited`, if the assignee is an active agent of
    the workspace: otherwise it inserts nothing, takes no number and returns no row.

    One round trip instead of five (the agent's read, the number, three inserts). Every insert
    selects from the number's row, which the counter's increment returns only when the agent is
    active, so without it none happens. The run's foreign key to the task is checked at the end
    of the statement, when both rows exist.
    """
    number = (
        workspaces.update()
        .where(
            workspaces.c.id == sa.bindparam("workspace_id"),
            sa.exists().where(
                agents.c.id == sa.bindparam("task_agent_id"),
                agents.c.workspace_id == workspaces.c.id,
                agents.c.status == AgentStatus.ACTIVE.value,
                agents.c.requires_approval.is_(False),
            ),
        )
        .values(task_counter=workspaces.c.task_counter + 1)
        .returning(workspaces.c.task_counter.label("number"), workspaces.c.task_key)
        .cte("number")
    )

    def from_number(table: sa.Table, prefix: str, names: list[str], *extra: Any) -> Any:
        values = [sa.bindparam(f"{prefix}_{name}", type_=table.c[name].type) for name in names]
        return table.insert().from_select(
            [*names, *(column.name for column in extra)],
            sa.select(*values, *extra).select_from(number),
        )

    task_columns = [c.name for c in tasks.c if c.name != "number"]
    new_task = from_number(tasks, "task", task_columns, number.c.number)
    new_run = from_number(runs, "run", [c.name for c in runs.c if c.name in _RUN_FIELDS])
    inserts = [new_task.cte("new_task"), new_run.cte("new_run")]
    if audited:
        entry = from_number(audit_events, "audit", [c.name for c in audit_events.c])
        inserts.append(entry.cte("new_audit_event"))
    return sa.select(number.c.number, number.c.task_key).add_cte(*inserts)


_TASK_AND_RUN = _task_and_run_at_once(audited=False)
_TASK_AND_RUN_AUDITED = _task_and_run_at_once(audited=True)


def numbering(workspace_id: UUID) -> tuple[str, UUID]:
    """The `Store.write(turn=...)` key of the transactions that take a number from the
    workspace's counter (issue 21)."""
    return ("task numbers", workspace_id)


async def next_task_number(conn: Connection, workspace_id: UUID) -> tuple[int, str]:
    """Take the workspace's next task number and return it with the workspace's task key."""
    row = (await conn.execute(_NEXT_NUMBER, {"workspace_id": workspace_id})).one()
    return int(row.number), str(row.task_key)


class AgentNotActive(Conflict):
    """The task's agent is not an active agent of the workspace: nothing was inserted. A
    caller that wants to say why (missing, paused, terminated) asks its admission check."""

    def __init__(self) -> None:
        super().__init__("the agent is not an active agent of this workspace")


_ACTIVE_AGENT = sa.select(agents.c.id).where(
    agents.c.id == sa.bindparam("agent_id"),
    agents.c.workspace_id == sa.bindparam("workspace_id"),
    agents.c.status == AgentStatus.ACTIVE.value,
    agents.c.requires_approval.is_(False),
)
# An active agent whose tasks wait for an approval before they are queued: read only when the
# insert above found no agent it may queue for, so ungated creates pay nothing for it.
_GATED_AGENT = sa.select(agents.c.approval_ttl_s, agents.c.approval_default).where(
    agents.c.id == sa.bindparam("agent_id"),
    agents.c.workspace_id == sa.bindparam("workspace_id"),
    agents.c.status == AgentStatus.ACTIVE.value,
    agents.c.requires_approval.is_(True),
)


def _new_task(
    workspace_id: UUID,
    agent_id: UUID,
    title: str,
    prompt: str,
    status: TaskStatus,
    now: datetime,
    fields: dict[str, Any],
) -> dict[str, Any]:
    """Every column of a new task but its number."""
    return {
        "id": time_ordered_id(),
        "workspace_id": workspace_id,
        "title": title,
        "prompt": prompt,
        "agent_id": agent_id,
        "creator_user_id": fields.get("creator_user_id"),
        "creator_key_id": fields.get("creator_key_id"),
        "status": status.value,
        "priority": fields.get("priority", 0),
        "labels": fields.get("labels") or [],
        "result": None,
        "error": None,
        "created_at": now,
        "updated_at": now,
        "parent_id": fields.get("parent_id"),
        "origin_key": fields.get("origin_key"),
        "blocks_parent": fields.get("blocks_parent", True),
        "dependencies": 0,
        "dependents": 0,
        "steps": 0,
        "budget_override_usd": None,
        "elapsed_s": 0.0,
    }


async def insert_task_with_run(
    conn: Connection,
    *,
    workspace_id: UUID,
    agent_id: UUID,
    title: str,
    prompt: str,
    now: datetime,
    audit: Callable[[UUID, UUID | None], dict[str, Any]] | None = None,
    **fields: Any,
) -> tuple[TaskRecord, RunRecord | None]:
    """Create a queued task and its queued run; returns both as stored (no read-back).

    Only for an active agent of the workspace: otherwise AgentNotActive (a Conflict), and
    nothing is inserted (on PostgreSQL the check is part of the one statement that inserts).
    For an agent that requires approval the task is `awaiting_approval`, without a run (None),
    and its pending approval is recorded with it.
    `audit(task_id, run_id)` gives the audit event of the create (`audit.entry_by`), inserted
    with them. `fields`: creator_user_id, creator_key_id, priority, labels, parent_id,
    origin_key (the tool step that created a subtask), blocks_parent (whether the parent
    waits for it).
    """
    task = _new_task(workspace_id, agent_id, title, prompt, TaskStatus.QUEUED, now, fields)
    run = _queued_run(task["id"], workspace_id, agent_id, now, task["priority"])
    entry = None if audit is None else audit(task["id"], run["id"])
    if conn.dialect.name == "postgresql":
        params = {f"task_{k}": v for k, v in task.items()}
        params.update({f"run_{k}": v for k, v in run.items()})
        params["workspace_id"] = workspace_id
        statement = _TASK_AND_RUN
        if entry is not None:
            params.update({f"audit_{k}": v for k, v in entry.items()})
            statement = _TASK_AND_RUN_AUDITED
        row = (await conn.execute(statement, params)).first()
        if row is None:
            gated = await _awaiting(conn, task, audit)
            if gated is None:
                raise AgentNotActive
            return gated, None
        number, task_key = int(row.number), str(row.task_key)
    else:
        active = {"agent_id": agent_id, "workspace_id": workspace_id}
        if (await conn.execute(_ACTIVE_AGENT, active)).first() is None:
            gated = await _awaiting(conn, task, audit)
            if gated is None:
                raise AgentNotActive
            return gated, None
        number, task_key = await next_task_number(conn, workspace_id)
        await conn.execute(_INSERT_TASK, {**task, "number": number})
        await conn.execute(_INSERT_RUN, run)
        if entry is not None:
            await conn.execute(_INSERT_AUDIT, entry)
    return TaskRecord.of({**task, "number": number, "task_key": task_key}), _stored_run(run)


async def _awaiting(
    conn: Connection,
    task: dict[str, Any],
    audit: Callable[[UUID, UUID | None], dict[str, Any]] | None,
) -> TaskRecord | None:
    """Insert `task` awaiting approval, with its pending approval, when its agent is active and
    requires approval; None (nothing inserted) otherwise."""
    agent = (
        await conn.execute(
            _GATED_AGENT, {"agent_id": task["agent_id"], "workspace_id": task["workspace_id"]}
        )
    ).first()
    if agent is None:
        return None
    task = {**task, "status": TaskStatus.AWAITING_APPROVAL.value}
    number, task_key = await next_task_number(conn, task["workspace_id"])
    await conn.execute(_INSERT_TASK, {**task, "number": number})
    if audit is not None:
        await conn.execute(_INSERT_AUDIT, audit(task["id"], None))
    await approval_store.insert(
        conn,
        workspace_id=task["workspace_id"],
        kind=ApprovalKind.TASK,
        task_id=task["id"],
        agent_id=task["agent_id"],
        subject={"title": task["title"], "number": f"{task_key}-{number}"},
        default_outcome=agent.approval_default or Outcome.DENY.value,
        ttl_s=agent.approval_ttl_s,
        now=task["created_at"],
    )
    return TaskRecord.of({**task, "number": number, "task_key": task_key})


async def insert_blocked_task(
    conn: Connection,
    *,
    workspace_id: UUID,
    agent_id: UUID,
    title: str,
    prompt: str,
    now: datetime,
    **fields: Any,
) -> TaskRecord:
    """Create a `blocked` task, without a run: it is queued when its blockers have ended."""
    task = _new_task(workspace_id, agent_id, title, prompt, TaskStatus.BLOCKED, now, fields)
    number, task_key = await next_task_number(conn, workspace_id)
    await conn.execute(_INSERT_TASK, {**task, "number": number})
    return TaskRecord.of({**task, "number": number, "task_key": task_key})


async def insert_run(
    conn: Connection,
    task_id: UUID,
    workspace_id: UUID,
    agent_id: UUID,
    now: datetime,
    *,
    priority: int = 0,
) -> RunRecord:
    """Enqueue a run of a task (claimed by `priority`, higher first); returns it as stored.

    A task holds at most one queued or running run (its checkout, `uq_runs_task_active`): a
    second is Conflict.
    """
    run = _queued_run(task_id, workspace_id, agent_id, now, priority)
    try:
        await conn.execute(_INSERT_RUN, run)
    except exc.IntegrityError as err:
        raise Conflict("the task already has a queued or running run") from err
    return _stored_run(run)


def _queued_run(
    task_id: UUID, workspace_id: UUID, agent_id: UUID, now: datetime, priority: int
) -> dict[str, Any]:
    return {
        "id": time_ordered_id(),
        "workspace_id": workspace_id,
        "task_id": task_id,
        "agent_id": agent_id,
        "status": RunStatus.QUEUED.value,
        "attempt": 0,
        "priority": priority,
        "failures": 0,
        "queued_at": now,
        "trace_parent": TRACE_PARENT.get(),  # set only while tracing
    }


# A queued run's columns that its insert leaves to their defaults.
_RUN_DEFAULTS: dict[str, Any] = {**{c.name: None for c in runs.c}, "lost_leases": 0}


def _stored_run(run: dict[str, Any]) -> RunRecord:
    return RunRecord.of({**_RUN_DEFAULTS, **run})


async def update_task(
    conn: Connection, workspace_id: UUID, task_id: UUID, values: dict[str, Any], now: datetime
) -> bool:
    """Change a task's editable fields; False if it is not in this workspace."""
    result = await conn.execute(
        tasks.update()
        .where(tasks.c.id == task_id, tasks.c.workspace_id == workspace_id)
        .values(**values, updated_at=now)
    )
    return int(result.rowcount) == 1


async def set_task_status(
    conn: Connection, task_id: UUID, status: TaskStatus, now: datetime, **values: Any
) -> bool:
    """Move a task to `status` if the state machine allows it from where it is now."""
    result = await conn.execute(
        tasks.update()
        .where(tasks.c.id == task_id, tasks.c.status.in_([s.value for s in task_sources(status)]))
        .values(status=status.value, updated_at=now, **values)
    )
    return int(result.rowcount) == 1


async def cancel_queued_run(conn: Connection, run_id: UUID, now: datetime) -> bool:
    """End a run that no worker holds; False if it is no longer queued."""
    result = await conn.execute(
        runs.update()
        .where(runs.c.id == run_id, runs.c.status.in_([RunStatus.QUEUED.value]))
        .values(status=RunStatus.CANCELLED.value, finished_at=now, error="cancelled on request")
    )
    return int(result.rowcount) == 1


@dataclass(frozen=True, slots=True)
class CancelledMany:
    """What `cancel_many` changed."""

    tasks: list[UUID]  # moved to `cancelled`
    runs: list[tuple[UUID, UUID]]  # (run, task) of queued runs ended with them
    stopping: list[tuple[UUID, UUID]]  # (run, task) of running runs asked to stop


async def cancel_many(conn: Connection, task_ids: list[UUID], now: datetime) -> CancelledMany:
    """Cancel these tasks set-wise: queued runs end, running ones are asked to stop (their
    workers end them and their tasks), every other task that has not ended is `cancelled`.

    The runs before the tasks, the order a run's end takes them in (else the two can deadlock).
    """
    if not task_ids:
        return CancelledMany([], [], [])
    ended = await conn.execute(
        runs.update()
        .where(runs.c.task_id.in_(task_ids), runs.c.status == RunStatus.QUEUED.value)
        .values(status=RunStatus.CANCELLED.value, finished_at=now, error="cancelled on request")
        .returning(runs.c.id, runs.c.task_id)
    )
    cancelled_runs = [(row.id, row.task_id) for row in ended]
    asked = await conn.execute(
        runs.update()
        .where(
            runs.c.task_id.in_(task_ids),
            runs.c.status == RunStatus.RUNNING.value,
            runs.c.cancel_requested_at.is_(None),
        )
        .values(cancel_requested_at=now)
        .returning(runs.c.id, runs.c.task_id)
    )
    stopping = [(row.id, row.task_id) for row in asked]
    held = {task_id for _, task_id in stopping}
    sources = [s.value for s in task_sources(TaskStatus.CANCELLED)]
    moved = await conn.execute(
        tasks.update()
        .where(
            tasks.c.id.in_([t for t in task_ids if t not in held]),
            tasks.c.status.in_(sources),
        )
        .values(status=TaskStatus.CANCELLED.value, updated_at=now, error="cancelled on request")
        .returning(tasks.c.id)
    )
    return CancelledMany([row.id for row in moved], cancelled_runs, stopping)


async def running_among(conn: Connection, run_ids: list[UUID]) -> int:
    """How many of these runs are still running."""
    if not run_ids:
        return 0
    query = sa.select(sa.func.count()).where(
        runs.c.id.in_(run_ids), runs.c.status == RunStatus.RUNNING.value
    )
    return int((await conn.execute(query)).scalar_one())


async def list_runs(conn: Connection, task_id: UUID) -> list[RunRecord]:
    """Every run of a task, oldest first."""
    rows = await conn.execute(
        sa.select(runs).where(runs.c.task_id == task_id).order_by(runs.c.queued_at, runs.c.id)
    )
    return [RunRecord.of(row._mapping) for row in rows]


async def add_comment(
    conn: Connection,
    *,
    workspace_id: UUID,
    task_id: UUID,
    author_type: str,
    author_id: UUID | None,
    body: str,
    now: datetime,
    origin_key: str | None = None,
) -> CommentRecord:
    """Append a comment to a task; returns it as stored."""
    row = {
        "id": time_ordered_id(),
        "workspace_id": workspace_id,
        "task_id": task_id,
        "author_type": author_type,
        "author_id": author_id,
        "body": body,
        "created_at": now,
        "origin_key": origin_key,
    }
    await conn.execute(task_comments.insert().values(**row))
    return CommentRecord.of(row)


async def list_comments(
    conn: Connection, task_id: UUID, *, limit: int, after: tuple[datetime, UUID] | None
) -> Page[CommentRecord]:
    """A page of a task's comments, oldest first, keyset-paginated on (created_at, id)."""
    c = task_comments.c
    query = sa.select(task_comments).where(c.task_id == task_id)
    page = await keyset(
        conn, query, c.created_at, c.id, limit=limit, after=after, newest_first=False
    )
    return page.map(lambda row: CommentRecord.of(row._mapping))


async def get_task(conn: Connection, workspace_id: UUID, task_id: UUID) -> TaskRecord | None:
    """The task in this workspace, or None."""
    row = (
        await conn.execute(
            sa.select(*_TASK_COLUMNS)
            .select_from(tasks.join(workspaces, workspaces.c.id == tasks.c.workspace_id))
            .where(tasks.c.id == task_id, tasks.c.workspace_id == workspace_id)
        )
    ).first()
    return None if row is None else TaskRecord.of(row._mapping)


async def list_tasks(
    conn: Connection,
    workspace_id: UUID,
    *,
    limit: int,
    after: tuple[datetime, UUID] | None,
    status: str | None = None,
    agent_id: UUID | None = None,
    label: str | None = None,
    parent_id: UUID | None = None,
    top_level: bool = False,
    search: str | None = None,
    dialect: str = "sqlite",
) -> Page[TaskRecord]:
    """A page of the workspace's tasks, newest first, keyset-paginated on (created_at, id).

    `search` matches a substring of the title or the prompt, case-insensitively (`ILIKE`;
    SQLite's LIKE folds ASCII letters only). Trigram indexes serve it (migration 0020): the
    matches are looked up in them first, and read by key when there are few enough
    (`_search_candidates`, `_pg_search_candidates`); else the newest-first scan finds a page
    of a common word soon.
    """
    candidates: list[Any] | None = None
    if search and dialect == "sqlite":
        candidates = await _search_candidates(conn, search)
    elif search and dialect == "postgresql":
        candidates = await _pg_search_candidates(conn, workspace_id, search)
    # With candidates, SQLite must read them by rowid: its planner, without statistics, would
    # rather take an index on an equality (the workspace's, or top-level tasks'), read every
    # task of the workspace and test each. A unary plus makes such a term no index's.
    in_workspace: sa.ColumnElement[Any] = tasks.c.workspace_id
    parent: sa.ColumnElement[Any] = tasks.c.parent_id
    if candidates is not None and dialect == "sqlite":
        in_workspace, parent = _unindexed(tasks.c.workspace_id), _unindexed(tasks.c.parent_id)
    joined = tasks.join(workspaces, workspaces.c.id == tasks.c.workspace_id)
    # With SQLite's candidates only the keys are sorted, then the page's rows read: sorting
    # whole rows (prompts and all) of a few thousand candidates took it 34 ms, the keys 3 ms.
    keys_only = candidates is not None and dialect == "sqlite"
    columns = [tasks.c.id, tasks.c.created_at] if keys_only else _TASK_COLUMNS
    query = sa.select(*columns).select_from(joined).where(in_workspace == workspace_id)
    if status is not None:
        query = query.where(tasks.c.status == status)
    if agent_id is not None:
        query = query.where(tasks.c.agent_id == agent_id)
    if label is not None:
        query = query.where(_has_label(label, dialect))
    if parent_id is not None:
        query = query.where(tasks.c.parent_id == parent_id)
    elif top_level:
        query = query.where(parent.is_(None))
    if search:
        query = query.where(_matches(search))
        if candidates is not None:
            key = _ROWID if dialect == "sqlite" else tasks.c.id
            query = query.where(key.in_(candidates))
    page = await keyset(
        conn, query, tasks.c.created_at, tasks.c.id, limit=limit, after=after, newest_first=True
    )
    if keys_only and page.rows:
        ids = [row.id for row in page.rows]
        found = await conn.execute(
            sa.select(*_TASK_COLUMNS).select_from(joined).where(tasks.c.id.in_(ids))
        )
        by_id = {row.id: row for row in found}
        page = Page([by_id[task_id] for task_id in ids], page.next_after)
    return page.map(lambda row: TaskRecord.of(row._mapping))


async def runs_for_tasks(conn: Connection, task_ids: list[UUID]) -> dict[UUID, RunRecord]:
    """The latest run of each given task, in one query."""
    if not task_ids:
        return {}
    result = await conn.execute(
        sa.select(runs).where(runs.c.task_id.in_(task_ids)).order_by(runs.c.queued_at)
    )
    latest = {row.task_id: row for row in result}
    return {task_id: RunRecord.of(row._mapping) for task_id, row in latest.items()}


# SQLite's trigram index (`tasks_search`, FTS5, migration 0020) and the tasks' rowid it is
# keyed on (kept by VACUUM and VACUUM INTO: measured on SQLite 3.40); the rowids of the tasks
# not yet in it (migration 0023), which `index_pending` moves into it in batches.
_TASKS_SEARCH = sa.table(
    "tasks_search", sa.column("rowid"), sa.column("title"), sa.column("prompt")
)
_PENDING = sa.table("tasks_search_pending", sa.column("task_rowid", sa.Integer))
_ROWID: sa.ColumnElement[int] = sa.literal_column("tasks.rowid", sa.Integer)
# Matches looked up by rowid and sorted, at most; with more, the text is common enough that
# the newest-first scan fills a page soon (one task in 50 of 100,000 matches, at least).
SEARCH_CANDIDATES_MAX = 2_000


async def _search_candidates(conn: Connection, text: str) -> list[int] | None:
    """SQLite: the rowids of every task whose title or prompt may hold `text` (a superset of
    LIKE's matches: the trigram index folds case beyond ASCII), from the trigram index; None
    when it cannot say (fewer than 3 characters) or when there are more than
    SEARCH_CANDIDATES_MAX (the caller then scans newest first, LIKE alone deciding).

    On its own, SQLite's planner prefers the newest-first scan whatever the index says, which
    reads all 100,000 tasks for a rare word (about 50 ms); by rowid it is under a millisecond.
    """
    if len(text) < 3:
        return None
    phrase = '"' + text.replace('"', '""') + '"'  # one FTS5 string: the text as a substring
    matched = sa.select(_TASKS_SEARCH.c.rowid).where(
        sa.literal_column("tasks_search").op("MATCH")(phrase)
    )
    # A task not yet indexed may match too: LIKE decides for it as for the rest.
    found = await conn.execute(
        sa.union_all(matched, sa.select(_PENDING.c.task_rowid)).limit(SEARCH_CANDIDATES_MAX + 1)
    )
    rowids = [int(row[0]) for row in found]
    return None if len(rowids) > SEARCH_CANDIDATES_MAX else rowids


async def index_pending(conn: Connection, limit: int) -> int:
    """SQLite: move up to `limit` tasks, oldest first, from `tasks_search_pending` into the
    trigram index; returns how many (fewer than `limit`: none are left). In one transaction
    with the queue's rows, so a task is in exactly one of the two.

    Many tasks in one FTS5 insert cost about a fifth of one each (measured: 25–35 µs a task
    in batches of 100–200, against 150 µs alone, for prompts of 300 characters)."""
    batch = sa.select(_PENDING.c.task_rowid).order_by(_PENDING.c.task_rowid).limit(limit)
    rowids = [int(row[0]) for row in await conn.execute(batch)]
    if not rowids:
        return 0
    rows = sa.select(_ROWID, tasks.c.title, tasks.c.prompt).where(_ROWID.in_(rowids))
    await conn.execute(_TASKS_SEARCH.insert().from_select(["rowid", "title", "prompt"], rows))
    await conn.execute(sa.delete(_PENDING).where(_PENDING.c.task_rowid.in_(rowids)))
    return len(rowids)


# Tasks per transaction of `index_all_pending`: past 100–200 the cost per task stops falling
# (about 30 µs for a 300-character prompt), and a batch holds the write lock for some 5 ms.
INDEX_BATCH = 200


async def index_all_pending(store: Store, batch: int = INDEX_BATCH) -> int:
    """Index every pending task, `batch` per transaction, each off the event loop
    (`Store.write_apart`); returns how many. A no-op on PostgreSQL."""
    if not store.is_sqlite:
        return 0

    async def step(conn: Connection) -> int:
        return await index_pending(conn, batch)

    total = 0
    while True:
        indexed = await store.write_apart(step)
        total += indexed
        if indexed < batch:
            return total


async def _pg_search_candidates(
    conn: Connection, workspace_id: UUID, text: str
) -> list[UUID] | None:
    """PostgreSQL: the ids of the workspace's tasks whose title or prompt holds `text`, through
    the trigram indexes; None when it cannot say (fewer than 3 characters) or when there are
    more than SEARCH_CANDIDATES_MAX.

    Its planner misjudges how rare a word is (it expected 894 of 100,000 tasks for one in 80)
    and, for a page newest first, would rather scan backwards through every task: 153 ms. The
    ids first, then those tasks by key: a few milliseconds.
    """
    if len(text) < 3:
        return None
    found = await conn.execute(
        sa.select(tasks.c.id)
        .where(tasks.c.workspace_id == workspace_id, _matches(text))
        .limit(SEARCH_CANDIDATES_MAX + 1)
    )
    ids = list(found.scalars())
    return None if len(ids) > SEARCH_CANDIDATES_MAX else ids


def _unindexed(column: sa.Column[Any]) -> sa.ColumnElement[Any]:
    """SQLite: the column as `+tasks.<name>`, the same value, but no index serves a term on
    it."""
    return sa.type_coerce(sa.literal_column(f"+tasks.{column.name}"), column.type)


def _matches(text: str) -> sa.ColumnElement[bool]:
    """The title or the prompt holds `text`, case-insensitively (`ILIKE`)."""
    pattern = "%" + _escape_like(text) + "%"
    return sa.or_(
        tasks.c.title.ilike(pattern, escape="\\"),
        tasks.c.prompt.ilike(pattern, escape="\\"),
    )


def _escape_like(text: str) -> str:
    """`text` matched literally by LIKE (its wildcards and the escape character escaped)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _has_label(label: str, dialect: str) -> sa.ColumnElement[bool]:
    if dialect == "postgresql":
        array = sa.func.jsonb_build_array(sa.cast(label, sa.String))
        return tasks.c.labels.op("@>")(array)
    each = sa.func.json_each(tasks.c.labels).table_valued("value")
    return sa.exists(sa.select(1).select_from(each).where(each.c.value == label))


async def requeue_failed(conn: Connection, task_id: UUID, now: datetime) -> bool:
    """Queue a failed task again with a new run; False if it is no longer failed (someone
    retried it meanwhile)."""
    task = (
        await conn.execute(
            sa.select(tasks.c.workspace_id, tasks.c.agent_id, tasks.c.priority).where(
                tasks.c.id == task_id, tasks.c.status == TaskStatus.FAILED.value
            )
        )
    ).first()
    if task is None:
        return False
    if not await set_task_status(conn, task_id, TaskStatus.QUEUED, now, result=None, error=None):
        return False
    await insert_run(conn, task_id, task.workspace_id, task.agent_id, now, priority=task.priority)
    return True
