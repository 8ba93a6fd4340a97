"""The run queue's contract on both backends (DESIGN §3): leases, fences, retries, fairness.

Claims, renewals, the reaper and the event fence run against real SQLite and PostgreSQL; the
clock is passed in, so lease expiry and backoff are exact.
"""

from __future__ import annotations

import random
import uuid
from datetime import datetime, timedelta

import sqlalchemy as sa

from bullpen.domain.events import EventKind
from bullpen.domain.runs import ClaimedRun, Held, Redelivery, RetryPolicy, RunOutcome
from bullpen.domain.status import RunStatus
from bullpen.queue.worker import reap
from bullpen.store import claims as claim_store
from bullpen.store import events as event_store
from bullpen.store import runs as run_store
from bullpen.store.base import Store
from bullpen.store.tables import agents, runs, tasks
from bullpen.streams.bus.memory import MemoryBus
from bullpen.streams.eventlog import EventLog
from tests.support.seed import NOW, new_task, workspace_with_agent

LEASE = timedelta(seconds=30)
POLICY = RetryPolicy(max_attempts=3, base_s=10.0, max_s=100.0)


async def _claim(
    store: Store, limit: int = 10, owner: str = "w", at: datetime = NOW
) -> list[ClaimedRun]:
    async with store.write() as conn:
        return (await claim_store.claim(conn, owner=owner, limit=limit, now=at, lease=LEASE)).runs


async def _run(store: Store, run_id: uuid.UUID) -> sa.Row:  # type: ignore[type-arg]
    async with store.read() as conn:
        return (await conn.execute(sa.select(runs).where(runs.c.id == run_id))).one()


async def _task_status(store: Store, task_id: uuid.UUID) -> str:
    async with store.read() as conn:
        query = sa.select(tasks.c.status).where(tasks.c.id == task_id)
        return str((await conn.execute(query)).scalar_one())


async def test_an_expired_lease_is_retried_after_a_backoff(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    task_id, run_id = await new_task(store, ws, agent)
    (held,) = await _claim(store)
    later = NOW + LEASE + timedelta(seconds=1)
    async with store.write() as conn:
        assert await run_store.expired(conn, now=NOW + LEASE - timedelta(seconds=1)) == []
        reaped = await reap(conn, now=later, policy=POLICY)
    assert [(r.run_id, r.status) for r, _ in reaped] == [(run_id, RunStatus.QUEUED)]
    row = await _run(store, run_id)
    assert row.failures == 1 and row.lease_owner is None
    # Backoff: base 10 s jittered to 5–10 s; not claimable before it, claimable after.
    assert later + timedelta(seconds=5) <= row.available_at <= later + timedelta(seconds=10)
    assert await _task_status(store, task_id) == "queued"
    assert await _claim(store, at=later + timedelta(seconds=4)) == []
    (again,) = await _claim(store, at=later + timedelta(seconds=10))
    assert again.id == held.id and again.attempt == 2 and again.failures == 1


async def test_a_renewed_lease_is_not_reaped(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    await new_task(store, ws, agent)
    (held,) = await _claim(store)
    async with store.write() as conn:
        lost = await run_store.renew(
            conn, owner="w", held=[Held(held.id, held.attempt)], now=NOW + LEASE, lease=LEASE
        )
        assert lost == []
        assert await run_store.expired(conn, now=NOW + LEASE + timedelta(seconds=1)) == []


async def test_the_last_allowed_failure_dead_letters_the_run_with_its_reason(
    store: Store,
) -> None:
    ws, agent = await workspace_with_agent(store)
    task_id, run_id = await new_task(store, ws, agent)
    at = NOW
    for failure in range(1, POLICY.max_attempts + 1):
        await _claim(store, at=at)
        at += LEASE + timedelta(seconds=1)
        async with store.write() as conn:
            ((redelivery, end),) = await reap(conn, now=at, policy=POLICY)
        at += timedelta(seconds=POLICY.max_s)
        if failure < POLICY.max_attempts:
            assert redelivery.status is RunStatus.QUEUED and end is None
    assert redelivery.status is RunStatus.FAILED
    row = await _run(store, run_id)
    assert row.status == "failed" and row.failures == POLICY.max_attempts
    assert row.error.startswith(f"dead-lettered after {POLICY.max_attempts} failed attempts")
    assert "stopped renewing the lease" in row.error
    assert await _task_status(store, task_id) == "failed"
    # The stream ends: the end event is stored with the next seq.
    assert end is not None and end.kind is EventKind.END and end.data["status"] == "failed"
    async with store.read() as conn:
        assert await event_store.end_seq(conn, run_id) == end.seq
    assert await _claim(store, at=at + timedelta(days=1)) == []


async def test_a_lost_delivery_with_a_cancel_request_ends_cancelled(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    task_id, run_id = await new_task(store, ws, agent)
    await _claim(store)
    async with store.write() as conn:
        assert await run_store.request_cancel(conn, run_id, NOW)
        ((redelivery, end),) = await reap(conn, now=NOW + 2 * LEASE, policy=POLICY)
    assert redelivery.status is RunStatus.CANCELLED and end is not None
    assert (await _run(store, run_id)).status == "cancelled"
    assert await _task_status(store, task_id) == "cancelled"


async def test_renew_reports_deliveries_another_attempt_took_over(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    await new_task(store, ws, agent)
    (first,) = await _claim(store, owner="old")
    later = NOW + LEASE + timedelta(seconds=1)
    async with store.write() as conn:
        await run_store.fail_deliveries(
            conn,
            [Held(first.id, first.attempt)],
            reason="test",
            now=later,
            policy=RetryPolicy(base_s=0),
        )
    (second,) = await _claim(store, owner="new", at=later)
    assert second.attempt == first.attempt + 1
    async with store.write() as conn:
        lost = await run_store.renew(
            conn, owner="old", held=[Held(first.id, first.attempt)], now=later, lease=LEASE
        )
        # The old holder's late writes are refused: no finish, no second re-queue.
        assert not await run_store.finish(
            conn, run_id=first.id, attempt=first.attempt, outcome=_failed(), now=later
        )
        assert (
            await run_store.fail_deliveries(
                conn, [Held(first.id, first.attempt)], reason="late", now=later
            )
            == []
        )
    assert lost == [Held(first.id, first.attempt)]
    row = await _run(store, first.id)
    assert (row.status, row.lease_owner, row.attempt) == ("running", "new", second.attempt)


async def test_the_event_log_refuses_a_stale_attempts_events(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    task_id, run_id = await new_task(store, ws, agent)
    (first,) = await _claim(store)
    lost_calls: list[str] = []
    bus = MemoryBus()
    async with EventLog(store, bus, coalesce_s=0, clock=lambda: NOW) as log:
        old = log.writer(
            run_id, task_id, ws, 0, attempt=first.attempt, on_lost=lambda: lost_calls.append("old")
        )
        old.text("first attempt ")
        await log.flush(old)
        async with store.write() as conn:
            await run_store.fail_deliveries(
                conn,
                [Held(run_id, first.attempt)],
                reason="t",
                now=NOW,
                policy=RetryPolicy(base_s=0),
            )
        (second,) = await _claim(store)
        new = log.writer(run_id, task_id, ws, old.committed_seq, attempt=second.attempt)
        new.emit(EventKind.STATUS, {"status": "running", "attempt": second.attempt})
        old.text("stale text")  # the paused worker wakes up and writes on
        new.text("second attempt")
        await log.flush(new)
        await log.flush(old)
    async with store.read() as conn:
        stored = await event_store.after(conn, run_id=run_id, after_seq=0, limit=100)
    assert [e.data.get("text") for e in stored if e.kind is EventKind.TEXT] == [
        "first attempt ",
        "second attempt",
    ]
    assert [e.seq for e in stored] == list(range(1, len(stored) + 1))
    assert lost_calls == ["old"] and old.lost


async def test_higher_priority_runs_are_claimed_first(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    await new_task(store, ws, agent, NOW)
    _, urgent = await new_task(store, ws, agent, NOW + timedelta(seconds=5))
    async with store.write() as conn:
        await conn.execute(runs.update().where(runs.c.id == urgent).values(priority=10))
    assert [c.id for c in await _claim(store, limit=1)] == [urgent]


async def test_claims_take_workspaces_in_turn(store: Store) -> None:
    """A flooding workspace does not starve another: claims go round-robin across workspaces."""
    ws_a, agent_a = await workspace_with_agent(store, "a")
    ws_b, agent_b = await workspace_with_agent(store, "b")
    async with store.write() as conn:
        await conn.execute(agents.update().values(max_concurrent_runs=100))
    for i in range(20):
        await new_task(store, ws_a, agent_a, NOW + timedelta(milliseconds=i))
    for i in range(2):
        await new_task(store, ws_b, agent_b, NOW + timedelta(seconds=1, milliseconds=i))
    claimed = await _claim(store, limit=4)
    assert [c.workspace_id for c in claimed].count(ws_b) == 2
    assert [c.workspace_id for c in claimed[:2]] in ([ws_a, ws_b], [ws_b, ws_a])


async def test_an_agent_never_runs_more_than_its_maximum(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    async with store.write() as conn:
        await conn.execute(agents.update().values(max_concurrent_runs=2))
    for i in range(5):
        await new_task(store, ws, agent, NOW + timedelta(seconds=i))
    first = await _claim(store, limit=5)
    assert len(first) == 2
    assert await _claim(store, limit=5) == []
    async with store.write() as conn:
        assert await run_store.finish(
            conn, run_id=first[0].id, attempt=first[0].attempt, outcome=_failed(), now=NOW
        )
    assert len(await _claim(store, limit=5)) == 1


async def test_a_paused_agent_gets_no_new_runs(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    await new_task(store, ws, agent)
    async with store.write() as conn:
        await conn.execute(agents.update().values(status="paused"))
    assert await _claim(store) == []
    async with store.write() as conn:
        await conn.execute(agents.update().values(status="active"))
    assert len(await _claim(store)) == 1


async def test_a_released_run_is_queued_again_at_once_without_a_failure(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    task_id, run_id = await new_task(store, ws, agent)
    (held,) = await _claim(store)
    async with store.write() as conn:
        assert await run_store.release(conn, [Held(held.id, held.attempt)], now=NOW) == 1
        assert await run_store.release(conn, [Held(held.id, held.attempt)], now=NOW) == 0
    row = await _run(store, run_id)
    assert (row.status, row.failures, row.available_at) == ("queued", 0, None)
    assert await _task_status(store, task_id) == "queued"
    assert [c.attempt for c in await _claim(store)] == [2]


async def test_the_backlog_count_stops_at_its_cap(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    for _ in range(5):
        await new_task(store, ws, agent)
    async with store.read() as conn:
        assert await run_store.queued_backlog(conn, ws, 3) == 3
        assert await run_store.queued_backlog(conn, ws, 10) == 5


def test_backoff_doubles_up_to_its_cap_with_jitter() -> None:
    policy = RetryPolicy(max_attempts=10, base_s=1.0, max_s=8.0)
    rng = random.Random(7)
    for failures, full in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (9, 8.0)]:
        delay = policy.delay(failures, rng).total_seconds()
        assert full / 2 <= delay <= full


def _failed() -> RunOutcome:
    return RunOutcome(RunStatus.FAILED, None, "x", None, None, None, None, None, None)


def _done() -> RunOutcome:
    return RunOutcome(RunStatus.DONE, "ok", None, None, None, None, None, None, None)


async def _fail(
    store: Store, held: list[ClaimedRun], *, lost: bool, policy: RetryPolicy
) -> list[Redelivery]:
    """End these deliveries as failed, at once due again (`lost`: their worker died)."""
    async with store.write() as conn:
        return await run_store.fail_deliveries(
            conn,
            [Held(c.id, c.attempt) for c in held],
            reason="x",
            now=NOW,
            policy=policy,
            lost=lost,
        )


async def test_a_claim_takes_at_most_one_run_whose_worker_died_under_it(store: Store) -> None:
    """Runs that crashed together are retried apart: one suspect per claim."""
    ws, agent = await workspace_with_agent(store)
    for i in range(3):
        await new_task(store, ws, agent, NOW + timedelta(seconds=i))
    await _fail(store, await _claim(store, limit=2), lost=True, policy=RetryPolicy(base_s=0))
    first = await _claim(store, limit=10)
    assert sorted(c.lost_leases for c in first) == [0, 1]
    (second,) = await _claim(store, limit=10)
    assert (second.lost_leases, second.failures) == (1, 1)


async def test_runs_that_failed_on_a_live_worker_are_not_suspects(store: Store) -> None:
    """A provider's 503 after a whole batch started is no sign of a poison run: the batch's
    retries are claimed together, not one per claim."""
    ws, agent = await workspace_with_agent(store)
    for i in range(3):
        await new_task(store, ws, agent, NOW + timedelta(seconds=i))
    await _fail(store, await _claim(store, limit=3), lost=False, policy=RetryPolicy(base_s=0))
    again = await _claim(store, limit=10)
    assert [(c.failures, c.lost_leases) for c in again] == [(1, 0)] * 3


def test_quarantine_starts_early_enough_to_leave_a_good_run_its_last_attempt() -> None:
    assert [RetryPolicy(max_attempts=n).quarantine_at for n in (1, 2, 3, 4, 5, 10)] == [
        1,
        1,
        2,
        2,
        2,
        2,
    ]


async def test_a_good_run_is_never_dead_lettered_for_a_poison_run_it_met(store: Store) -> None:
    """A poison run kills its worker whenever it runs; two good runs were claimed with it.

    A worker with three slots fills them claim after claim (each claim takes one suspect) and
    crashes whenever it holds the poison. Once the runs are quarantined it holds one such run
    at a time, so the good runs stop meeting the poison: it is dead-lettered, they are done.
    Without the quarantine all three would be dead-lettered together.
    """
    policy = RetryPolicy(max_attempts=4, base_s=0)
    ws, agent = await workspace_with_agent(store)
    poison = (await new_task(store, ws, agent, NOW))[1]
    good = [(await new_task(store, ws, agent, NOW + timedelta(seconds=i)))[1] for i in (1, 2)]
    for _ in range(10):
        held: list[ClaimedRun] = []
        while len(held) < 3:
            quarantined = any(c.lost_leases >= policy.quarantine_at for c in held)
            async with store.write() as conn:
                took = await claim_store.claim(
                    conn,
                    owner="w",
                    limit=3 - len(held),
                    now=NOW,
                    lease=LEASE,
                    lost_below=policy.quarantine_at if quarantined else None,
                )
            if not took.runs:
                break
            held += took.runs
        if not held:
            break
        if any(c.id == poison for c in held):
            await _fail(store, held, lost=True, policy=policy)  # it takes the worker down
            continue
        async with store.write() as conn:
            for c in held:
                assert await run_store.finish(
                    conn, run_id=c.id, attempt=c.attempt, outcome=_done(), now=NOW
                )
    ended = {run_id: await _run(store, run_id) for run_id in [poison, *good]}
    assert [(ended[r].status, ended[r].lost_leases) for r in good] == [("done", 2)] * 2
    assert (ended[poison].status, ended[poison].failures) == ("failed", 4)


async def test_a_claim_gives_each_workspace_no_more_than_its_room(store: Store) -> None:
    ws_a, agent_a = await workspace_with_agent(store, "a")
    ws_b, agent_b = await workspace_with_agent(store, "b")
    for i in range(5):
        await new_task(store, ws_a, agent_a, NOW + timedelta(seconds=i))
    await new_task(store, ws_b, agent_b, NOW + timedelta(seconds=9))
    async with store.write() as conn:
        took = await claim_store.claim(
            conn, owner="w", limit=10, now=NOW, lease=LEASE, room=lambda ws: 2
        )
    claimed = took.runs
    assert sorted(c.workspace_id == ws_b for c in claimed) == [False, False, True]


async def test_a_claim_says_whether_it_left_runs_waiting_for_a_cap(store: Store) -> None:
    """`held_back`: runs left that wait for an agent's cap (the worker looks again when one of
    its runs ends); not runs it took, nor runs beyond its limit (they wait for a free slot)."""
    ws, agent = await workspace_with_agent(store)
    for _ in range(3):
        await new_task(store, ws, agent)

    async def claim(limit: int) -> claim_store.Claim:
        async with store.write() as conn:
            return await claim_store.claim(conn, owner="w", limit=limit, now=NOW, lease=LEASE)

    beyond = await claim(1)
    assert (len(beyond.runs), beyond.held_back) == (1, False)  # the other two wait for a slot
    async with store.write() as conn:
        await conn.execute(agents.update().values(max_concurrent_runs=2))
    capped = await claim(10)
    assert (len(capped.runs), capped.held_back) == (1, True)  # the third waits for the cap
    async with store.write() as conn:
        await conn.execute(agents.update().values(max_concurrent_runs=10))
    rest = await claim(10)
    assert (len(rest.runs), rest.held_back) == (1, False)  # took every run there was
