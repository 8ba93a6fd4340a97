"""The breaker checks a worker makes: when it starts runs, and when a run ends.

Starts: in the claim's transaction, each agent that got runs counts its runs started in the
last hour (from its last resume, if later) with an index range bounded by its limit. Runs beyond
the limit are unclaimed at once (queued again as if never claimed) and the agent is paused, so
no more than `runs_per_hour` runs of an agent start within any hour. Ends: in the run's final
transaction, a failed run counts one more failure in a row (a run that ends `done` clears them),
and the agent's spend in the last hour is summed from the `cost_events` ledger (priced rows).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from bullpen.domain.breakers import WINDOW_S, BreakerLimits
from bullpen.domain.runs import ClaimedRun, Held, RunOutcome
from bullpen.domain.status import RunStatus
from bullpen.errors import BudgetExceeded
from bullpen.store import breakers as breaker_store
from bullpen.store import runs as run_store
from bullpen.store.base import Connection

_WINDOW = timedelta(seconds=WINDOW_S)


def _since(run: ClaimedRun, now: datetime) -> datetime:
    start = now - _WINDOW
    if run.breaker_since is not None and run.breaker_since > start:
        return run.breaker_since
    return start


async def check_starts(
    conn: Connection, claimed: list[ClaimedRun], defaults: BreakerLimits, now: datetime
) -> list[ClaimedRun]:
    """The claimed runs that may start; the others go back to the queue, their agent paused."""
    by_agent: dict[tuple[object, object], list[ClaimedRun]] = {}
    for run in claimed:
        by_agent.setdefault((run.workspace_id, run.agent_id), []).append(run)
    refused: set[object] = set()
    for group in by_agent.values():
        first = group[0]
        limit = defaults.with_overrides(first.agent_breakers).runs_per_hour
        if limit is None:
            continue
        started = await breaker_store.runs_started(
            conn, first.agent_id, _since(first, now), limit + len(group)
        )
        over = min(started - limit, len(group))
        if over <= 0:
            continue
        back = group[-over:]
        await run_store.unclaim(conn, [Held(r.id, r.attempt) for r in back], now=now)
        refused.update(r.id for r in back)
        await breaker_store.trip_breaker(
            conn,
            workspace_id=first.workspace_id,
            agent_id=first.agent_id,
            breaker="runs_per_hour",
            limit=limit,
            observed=started,
            reason=f"runs_per_hour: {limit} runs started within the last hour and more were "
            f"due to start (limit {limit})",
            now=now,
        )
    return [run for run in claimed if run.id not in refused] if refused else claimed


async def after_run(
    conn: Connection, run: ClaimedRun, outcome: RunOutcome, defaults: BreakerLimits, now: datetime
) -> None:
    """Count the run's end against its agent's failures in a row (a budget's stop is not a
    failure of the agent) and spend per hour."""
    limits = defaults.with_overrides(run.agent_breakers)
    # A run a budget stopped is not the agent misbehaving: the budget already holds its spend,
    # and pausing the agent too would outlast a raised budget until someone resumed it.
    if outcome.status is RunStatus.FAILED and outcome.error_code != BudgetExceeded.slug:
        failures = await breaker_store.run_failed(conn, run.agent_id)
        limit = limits.failures_in_a_row
        if limit is not None and failures >= limit:
            await breaker_store.trip_breaker(
                conn,
                workspace_id=run.workspace_id,
                agent_id=run.agent_id,
                breaker="failures_in_a_row",
                limit=limit,
                observed=failures,
                reason=f"failures_in_a_row: {failures} runs in a row failed (limit {limit})",
                now=now,
            )
            return
    usd = limits.usd_per_hour
    succeeded = outcome.status is RunStatus.DONE
    if usd is None:
        if succeeded:
            await breaker_store.run_succeeded(conn, run.agent_id)
        return
    if succeeded:
        spent = await breaker_store.succeeded_and_spent(conn, run.agent_id, _since(run, now))
    else:
        spent = await breaker_store.spent(conn, run.agent_id, _since(run, now))
    if spent >= usd:
        await breaker_store.trip_breaker(
            conn,
            workspace_id=run.workspace_id,
            agent_id=run.agent_id,
            breaker="usd_per_hour",
            limit=usd,
            observed=round(spent, 6),
            reason=f"usd_per_hour: the agent spent ${spent:.4f} within an hour (limit ${usd:g})",
            now=now,
        )
