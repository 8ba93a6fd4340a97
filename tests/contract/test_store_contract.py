"""One contract suite for the store, run unchanged against SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import re
import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.ext.asyncio import AsyncEngine

from bullpen.domain import tokens
from bullpen.domain.events import EventKind, RunEvent
from bullpen.domain.principal import Role
from bullpen.domain.runs import RunOutcome
from bullpen.domain.status import RunStatus
from bullpen.store import agents as agent_store
from bullpen.store import claims as claim_store
from bullpen.store import events as event_store
from bullpen.store import identity
from bullpen.store import runs as run_store
from bullpen.store import tasks as task_store
from bullpen.store.base import TURN_WIDTH, Store
from bullpen.store.tables import agents, audit_events, metadata, runs, tasks, workspaces
from tests.support.seed import NOW, insert_task, member_with_key, new_task, workspace_with_agent

LEASE = timedelta(seconds=30)


def _done(text: str = "ok") -> RunOutcome:
    return RunOutcome(RunStatus.DONE, text, None, NOW, 1.0, "simulated", "sim-1", 1, 2)


# Alembic cannot compare an index with a DESC column (it reads as an expression); that one is
# checked by name and definition below instead.
_EXPRESSION_INDEXES = {"ix_runs_queue_head"}


# The search's trigram indexes (migration 0020) are one backend's each, outside the tables:
# PostgreSQL's GIN indexes, SQLite's FTS5 table and its shadow tables (test_task_search.py).
_SEARCH_INDEXES = {"ix_tasks_title_trgm", "ix_tasks_prompt_trgm"}


def _compared(obj: object, name: str | None, type_: str, reflected: bool, other: object) -> bool:
    if type_ == "table" and (name or "").startswith("tasks_search"):
        return False
    return not (type_ == "index" and name in _EXPRESSION_INDEXES | _SEARCH_INDEXES)


async def test_migrations_match_the_tables(store: Store) -> None:
    def diff(sync_conn: sa.Connection) -> list[object]:
        context = MigrationContext.configure(sync_conn, opts={"include_object": _compared})
        return list(compare_metadata(context, metadata))

    def queue_head(sync_conn: sa.Connection) -> str:
        if sync_conn.dialect.name == "postgresql":
            query = "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_runs_queue_head'"
        else:
            query = "SELECT sql FROM sqlite_master WHERE name = 'ix_runs_queue_head'"
        return str(sync_conn.exec_driver_sql(query).scalar_one())

    async with store.read() as conn:
        assert await conn.run_sync(diff) == []
        definition = " ".join((await conn.run_sync(queue_head)).replace('"', "").split())
        predicates = await conn.run_sync(partial_predicates)
    assert "(status, workspace_id, priority DESC, queued_at, id)" in definition, definition
    assert predicates == _PARTIAL_PREDICATES


# The partial indexes' predicates, which Alembic's comparison does not look at (and the tables
# state for SQLite only), as each backend reports them: the words that matter, in order.
_PARTIAL_PREDICATES = {
    "uq_runs_task_active": ["status", "queued", "running"],
    "uq_approvals_task_pending": ["status", "pending"],
    "ix_cost_events_agent_priced": ["cost_usd", "0"],
}


def partial_predicates(sync_conn: sa.Connection) -> dict[str, list[str]]:
    if sync_conn.dialect.name == "postgresql":
        query = (
            "SELECT c.relname, pg_get_expr(i.indpred, i.indrelid) FROM pg_index i"
            " JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = ANY(:names)"
        )
        rows = sync_conn.execute(sa.text(query), {"names": list(_PARTIAL_PREDICATES)})
    else:
        query = "SELECT name, sql FROM sqlite_master WHERE type = 'index'"
        rows = [
            (name, sql.split(" WHERE ", 1)[1])
            for name, sql in sync_conn.exec_driver_sql(query)
            if name in _PARTIAL_PREDICATES and " WHERE " in (sql or "")
        ]
    words = re.compile(r"[a-z_]+|\d+")
    noise = {"text", "character", "varying", "double", "precision", "any", "array", "in"}
    return {
        name: [w for w in words.findall(predicate or "") if w not in noise]
        for name, predicate in rows
    }


async def test_task_numbers_count_per_workspace(store: Store) -> None:
    ws1, a1 = await workspace_with_agent(store, "w1")
    ws2, a2 = await workspace_with_agent(store, "w2")
    ids = [
        await new_task(store, ws1, a1),
        await new_task(store, ws1, a1),
        await new_task(store, ws2, a2),
    ]
    async with store.read() as conn:
        numbers = [
            (await task_store.get_task(conn, ws, t)).number
            for ws, (t, _) in zip([ws1, ws1, ws2], ids, strict=True)
        ]
    assert numbers == [1, 2, 1]


async def test_concurrent_task_creation_gets_distinct_numbers(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    await asyncio.gather(*(new_task(store, ws, agent) for _ in range(20)))
    async with store.read() as conn:
        numbers = sorted((await conn.execute(sa.select(tasks.c.number))).scalars())
    assert numbers == list(range(1, 21))


async def test_writes_with_one_turn_key_take_their_turns_in_arrival_order(store: Store) -> None:
    """`write(turn=k)` runs at most TURN_WIDTH of this process's transactions of one key at
    once, the rest waiting in arrival order; a nested one joins its opener's. On PostgreSQL a
    write of another key, or of none, does not wait for them (SQLite runs every write one at a
    time anyway). Keys leave nothing behind once nobody holds or awaits them."""
    began: list[str] = []
    release = asyncio.Event()

    async def hold(name: str) -> None:
        async with store.write(turn="k") as conn:
            began.append(name)
            async with store.write(turn="k") as inner:  # joins: no second turn to wait for
                assert inner is conn
            await release.wait()

    async def write(name: str, turn: str | None) -> None:
        async with store.write(turn=turn) as conn:
            began.append(name)
            await conn.execute(sa.select(1))

    holders = [asyncio.create_task(hold(f"holder {i}")) for i in range(TURN_WIDTH)]
    await asyncio.sleep(0.05)
    waiting = [asyncio.create_task(write(f"k{i}", "k")) for i in range(3)]
    others = [
        asyncio.create_task(write("other key", "j")),
        asyncio.create_task(write("none", None)),
    ]
    await asyncio.sleep(0.3)
    holding = [f"holder {i}" for i in range(TURN_WIDTH)]
    if store.is_sqlite:
        assert began == holding[:1]
    else:
        assert sorted(began) == [*holding, "none", "other key"]
        await asyncio.wait_for(asyncio.gather(*others), 5)
    release.set()
    await asyncio.wait_for(asyncio.gather(*holders, *waiting, *others), 5)
    assert [name for name in began if name.startswith("k")] == ["k0", "k1", "k2"]
    assert not store._turns  # no semaphore per key outlives its users


async def test_a_task_for_an_agent_not_active_here_inserts_nothing_and_takes_no_number(
    store: Store,
) -> None:
    ws, agent = await workspace_with_agent(store, "w1")
    _, other_agent = await workspace_with_agent(store, "w2")
    await new_task(store, ws, agent)
    async with store.write() as conn:
        await conn.execute(agents.update().where(agents.c.id == agent).values(status="paused"))
    for assignee in (agent, other_agent, uuid.uuid4()):  # paused, elsewhere, no such agent
        with pytest.raises(task_store.AgentNotActive):
            async with store.write() as conn:
                await task_store.insert_task_with_run(
                    conn, workspace_id=ws, agent_id=assignee, title="t", prompt="p", now=NOW
                )
    async with store.write() as conn:
        await conn.execute(agents.update().where(agents.c.id == agent).values(status="active"))
    (task_id, _) = await new_task(store, ws, agent)
    async with store.read() as conn:
        assert (await task_store.get_task(conn, ws, task_id)).number == 2  # no gap
        assert len((await conn.execute(sa.select(tasks.c.id))).all()) == 2
        assert len((await conn.execute(sa.select(runs.c.id))).all()) == 2


async def test_another_workspace_cannot_read_a_task_or_agent(store: Store) -> None:
    ws1, a1 = await workspace_with_agent(store, "w1")
    ws2, _ = await workspace_with_agent(store, "w2")
    task_id, _ = await new_task(store, ws1, a1)
    async with store.read() as conn:
        assert await task_store.get_task(conn, ws1, task_id) is not None
        assert await task_store.get_task(conn, ws2, task_id) is None
        assert await agent_store.get_agent(conn, ws2, a1) is None


async def test_claim_takes_oldest_first_and_marks_task_running(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    older, _ = await new_task(store, ws, agent, NOW)
    await new_task(store, ws, agent, NOW + timedelta(seconds=1))
    async with store.write() as conn:
        claimed = (await claim_store.claim(conn, owner="w", limit=1, now=NOW, lease=LEASE)).runs
    assert [c.task_id for c in claimed] == [older]
    assert claimed[0].attempt == 1 and claimed[0].agent_adapter == "llm"
    async with store.read() as conn:
        status = (
            await conn.execute(sa.select(tasks.c.status).where(tasks.c.id == older))
        ).scalar_one()
    assert status == "running"


async def test_concurrent_claimers_never_share_a_run(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    async with store.write() as conn:  # above the 40 queued, so only the claimers compete
        await conn.execute(agents.update().values(max_concurrent_runs=100))
    for _ in range(40):
        await new_task(store, ws, agent)

    async def claimer(name: str) -> list[uuid.UUID]:
        got: list[uuid.UUID] = []
        while True:
            async with store.write() as conn:
                took = await claim_store.claim(conn, owner=name, limit=3, now=NOW, lease=LEASE)
            batch = took.runs
            if not batch:
                return got
            got.extend(c.id for c in batch)

    results = await asyncio.gather(*(claimer(f"w{i}") for i in range(4)))
    claimed = [rid for r in results for rid in r]
    assert len(claimed) == 40 and len(set(claimed)) == 40


async def test_finish_is_fenced_by_attempt_and_state(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    task_id, run_id = await new_task(store, ws, agent)
    async with store.write() as conn:
        (claimed,) = (await claim_store.claim(conn, owner="w", limit=1, now=NOW, lease=LEASE)).runs
    async with store.write() as conn:
        assert not await run_store.finish(
            conn, run_id=run_id, attempt=claimed.attempt + 1, outcome=_done(), now=NOW
        )
        assert await run_store.finish(
            conn, run_id=run_id, attempt=claimed.attempt, outcome=_done("result"), now=NOW
        )
    async with store.write() as conn:  # a second finish of the same attempt is refused too
        assert not await run_store.finish(
            conn, run_id=run_id, attempt=claimed.attempt, outcome=_done("again"), now=NOW
        )
    async with store.read() as conn:
        task = await task_store.get_task(conn, ws, task_id)
        run = await run_store.get_run(conn, ws, run_id)
    assert (task.status, task.result) == ("done", "result")
    assert (run.status, run.provider, run.output_tokens) == ("done", "simulated", 2)


async def test_events_are_unique_per_seq_and_read_in_order(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    task_id, run_id = await new_task(store, ws, agent)
    evs = [RunEvent(run_id, task_id, seq, EventKind.TEXT, {"text": str(seq)}) for seq in (3, 1, 2)]
    async with store.write() as conn:
        await event_store.append(conn, evs, [ws] * 3, NOW)
    async with store.read() as conn:
        got = await event_store.after(conn, run_id=run_id, after_seq=1, limit=10)
        assert await event_store.last_seq(conn, run_id) == 3
        assert await event_store.task_runs(conn, task_id) == ("queued", [run_id])
        assert await event_store.task_runs(conn, uuid.uuid4()) == (None, [])
    assert [e.seq for e in got] == [2, 3] and got[0].data == {"text": "2"}
    with pytest.raises(sa.exc.IntegrityError):
        async with store.write() as conn:
            await event_store.append(conn, evs[:1], [ws], NOW)


async def test_api_key_lookup_by_digest_respects_owner_state(store: Store) -> None:
    ws, _ = await workspace_with_agent(store)
    secret = b"s" * 32
    async with store.write() as conn:
        key_id, key = await member_with_key(
            conn, ws, role=Role.VIEWER, secret=secret, email="a@x.io", now=NOW
        )
    async with store.read() as conn:
        record = await identity.find_api_key(conn, tokens.digest(secret, key))
        assert await identity.find_api_key(conn, tokens.digest(secret, key + "x")) is None
    assert record is not None and record.id == key_id and record.role is Role.VIEWER
    async with store.write() as conn:
        await conn.execute(sa.text("UPDATE users SET disabled_at = created_at"))
    async with store.read() as conn:
        assert await identity.find_api_key(conn, tokens.digest(secret, key)) is None


async def test_a_failed_transaction_leaves_nothing_behind(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    with pytest.raises(RuntimeError):
        async with store.write() as conn:
            await insert_task(conn, ws, agent, NOW)
            raise RuntimeError("boom")
    async with store.read() as conn:
        counts = [
            (await conn.execute(sa.select(sa.func.count()).select_from(t))).scalar_one()
            for t in (tasks, runs, audit_events)
        ]
    assert counts == [0, 0, 0]


async def test_a_read_apart_runs_off_the_loop_and_sees_what_its_transaction_may(
    store: Store,
) -> None:
    ws, agent = await workspace_with_agent(store)
    async with store.write() as conn:
        await insert_task(conn, ws, agent, NOW)
    ran_on: list[int] = []

    async def count(conn: Any) -> int:
        ran_on.append(threading.get_ident())
        return int((await conn.execute(sa.select(sa.func.count()).select_from(tasks))).scalar_one())

    assert await store.read_apart(count) == 1
    # SQLite: on a worker thread, not the loop's (an aggregate there would hold up every
    # request); PostgreSQL's driver waits off the loop already.
    assert (ran_on[-1] != threading.get_ident()) is store.is_sqlite
    async with store.write() as conn:  # inside a write: that transaction, its own rows seen
        await insert_task(conn, ws, agent, NOW)
        assert await store.read_apart(count) == 2
        assert ran_on[-1] == threading.get_ident()
    assert await asyncio.gather(*(store.read_apart(count) for _ in range(4))) == [2] * 4

    async def waits(conn: Any) -> int:
        await asyncio.sleep(0)  # not a statement: on SQLite's thread there is no loop to wait on
        return await count(conn)

    if store.is_sqlite:
        with pytest.raises(RuntimeError, match="awaited something other than its statements"):
            await store.read_apart(waits)
    else:
        assert await store.read_apart(waits) == 2


async def test_a_write_apart_runs_off_the_loop_and_holds_the_write_turn_to_its_commit(
    store: Store,
) -> None:
    """SQLite: the work runs on a worker thread while every other writer of the process
    waits; cancelled, it still waits for the thread's commit before it lets the next writer
    in (which would otherwise wait for SQLite's lock on the event loop)."""
    ws, agent = await workspace_with_agent(store)
    ran_on: list[int] = []
    gate = threading.Event()

    async def insert(conn: Any) -> int:
        ran_on.append(threading.get_ident())
        await insert_task(conn, ws, agent, NOW)
        if store.is_sqlite:
            gate.wait(10)  # the thread stays in its transaction until the test lets it go
        return 1

    async def count() -> int:
        async with store.read() as conn:
            found = await conn.execute(sa.select(sa.func.count()).select_from(tasks))
            return int(found.scalar_one())

    if not store.is_sqlite:  # PostgreSQL: a plain write
        assert await store.write_apart(insert) == 1
        assert ran_on == [threading.get_ident()] and await count() == 1
        return
    job = asyncio.create_task(store.write_apart(insert))
    await asyncio.sleep(0.05)
    assert ran_on and ran_on[0] != threading.get_ident()
    other = asyncio.create_task(new_task(store, ws, agent, NOW))
    await asyncio.sleep(0.05)
    assert not other.done()  # its turn comes after the write apart's
    job.cancel()
    await asyncio.sleep(0.05)
    assert not job.done() and not other.done()  # the thread has not committed yet
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await job
    await other
    assert await count() == 2  # the cancelled caller's transaction committed all the same


async def test_unreachable_database_maps_to_unavailable(store: Store) -> None:
    from bullpen.errors import Unavailable

    await store.close()
    store.engine.pool._creator = _refuse  # type: ignore[attr-defined]  # simulate an outage
    with pytest.raises(Unavailable):
        async with store.read() as conn:
            await conn.execute(sa.text("SELECT 1"))
    with pytest.raises(Unavailable):
        await store.read_apart(lambda conn: conn.execute(sa.text("SELECT 1")))


def _refuse(*_a: object, **_k: object) -> object:
    raise ConnectionRefusedError("database is down")


@pytest.mark.parametrize("status", [RunStatus.FAILED, RunStatus.CANCELLED])
async def test_terminal_outcomes_reach_the_task(store: Store, status: RunStatus) -> None:
    ws, agent = await workspace_with_agent(store)
    task_id, run_id = await new_task(store, ws, agent)
    async with store.write() as conn:
        (c,) = (await claim_store.claim(conn, owner="w", limit=1, now=NOW, lease=LEASE)).runs
        outcome = RunOutcome(status, None, "why", None, None, None, None, None, None)
        assert await run_store.finish(
            conn, run_id=run_id, attempt=c.attempt, outcome=outcome, now=NOW
        )
    async with store.read() as conn:
        task = await task_store.get_task(conn, ws, task_id)
    assert (task.status, task.error) == (status.value, "why")


@pytest.mark.parametrize("backend", ["postgres", "pgbouncer"])
@pytest.mark.with_settings(db_idle_transaction_timeout_s=0.5)
async def test_a_session_paused_inside_a_transaction_lets_go_of_its_locks(store: Store) -> None:
    """A process paused mid-transaction (here: one that stops sending) does not keep its row
    locks: PostgreSQL ends the session, and another connection can lock the row."""
    ws, _ = await workspace_with_agent(store)
    lock = sa.select(workspaces.c.id).where(workspaces.c.id == ws).with_for_update()
    assert isinstance(store.engine, AsyncEngine)
    paused = await store.engine.connect()
    try:
        await paused.begin()
        await paused.execute(lock)
        await asyncio.sleep(2.0)  # idle inside the transaction, past the timeout
        async with store.engine.begin() as other:
            assert await other.scalar(lock.with_for_update(nowait=True)) == ws
        with pytest.raises(sa.exc.DBAPIError):
            await paused.execute(lock)  # its session was ended
    finally:
        await paused.close()
