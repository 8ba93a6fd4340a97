"""Spend control while tokens stream: reserve before a call, extend in slices, stop at the cap.

Before a call, `Spend.open` reserves the prompt's cost and the cost of a first slice of output
(`slice_tokens`, or the call's `max_tokens` if fewer) against every budget that covers the call
and against the run's own cost ceiling, priced at the dearest model of the route (a fallback
may serve it). While the answer streams, `Meter.need` is told how many output tokens have
arrived; before they pass what is reserved, it reserves another slice. A budget with less
room than a slice grants what it has left, and one with nothing left refuses: the call is
refused before it starts (`BudgetExceeded`), or its stream is stopped there. The call's real
cost settles the reservation in the transaction that writes its ledger row.

So spend never passes a budget by more than what a provider streams after Bullpen stopped
reading (at most the tokens in flight, under one slice for the simulator and any provider
that stops generating when its stream is closed) plus the error of the prompt's estimate,
for each call in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from bullpen.domain.budgets import EPSILON_USD, BudgetRecord
from bullpen.domain.principal import Principal
from bullpen.domain.runs import ClaimedRun
from bullpen.errors import BudgetExceeded, BullpenError
from bullpen.gateway.catalog import Price, Target
from bullpen.gateway.router import Call, estimate_prompt_tokens
from bullpen.store import budgets as budget_store
from bullpen.store.base import Store
from bullpen.store.budgets import Draw

log = logging.getLogger(__name__)

# Output tokens reserved at a time while a call streams.
DEFAULT_SLICE_TOKENS = 512
# How long this process trusts its list of a workspace's budgets (another process's new budget
# takes effect within it; this process's own changes at once).
_BUDGETS_TTL_S = 2.0
# A reservation no process settled (a relay call whose process died) is charged after the
# call's deadline plus this margin.
_EXPIRY_MARGIN_S = 60.0


def dearest(chain: Sequence[Target]) -> Price:
    """Per-token prices no target of the chain exceeds (what a reservation must assume)."""
    prices = [t.provider.price(t.model) for t in chain]
    if not prices:
        return Price()
    return Price(
        input=max(p.input for p in prices),
        cached_input=max(p.cached_input for p in prices),
        output=max(p.output for p in prices),
    )


# Reserves up to an amount more for a meter's call; returns what was granted.
Source = Callable[["Meter", float], Awaitable[float]]


@dataclass(slots=True)
class Meter:
    """One call's hold on its budgets and ceiling while it streams."""

    source: Source  # the store (a run's call) or the process's pool (a relayed call)
    slice_tokens: int
    workspace_id: UUID
    budget_ids: list[UUID]
    price: Price
    ceiling_left_usd: float | None  # what the run's cost ceiling still allows (None: none)
    expires_at: datetime
    run_id: UUID | None
    api_key_id: UUID | None
    reservation_id: UUID | None = None
    reserved_usd: float = 0.0  # held against the budgets (and the ceiling) so far
    allowance_tokens: float = math.inf  # output tokens the reservation covers
    due: float = math.inf  # `need` has nothing to do until the output passes this
    prompt_usd: float = 0.0
    task_id: UUID | None = None  # a run's task: a budget override approved for it applies
    by_ceiling: bool = False  # the run's ceiling, not a budget, bounded the last grant
    exhausted: bool = False  # a reservation got nothing: the call ends with its allowance
    _token_usd: float = field(default=0.0)

    async def start(self, prompt_tokens: int, first_slice: int) -> None:
        """Reserve the prompt and a first slice of output, or refuse the call."""
        self._token_usd = self.price.output / 1_000_000
        self.prompt_usd = self.price.cost(prompt_tokens, 0, 0)
        if not self.budget_ids and self.ceiling_left_usd is None:
            return
        granted = await self._grant(self.prompt_usd + first_slice * self._token_usd)
        left = granted - self.prompt_usd
        if left < -EPSILON_USD or (self._token_usd > 0 and left < self._token_usd):
            raise self._refusal(before=True)
        self.allowance_tokens = left / self._token_usd if self._token_usd > 0 else math.inf
        self.due = self.allowance_tokens - self.slice_tokens / 2

    async def need(self, output_tokens: int) -> None:
        """Make sure `output_tokens` of output are reserved, and half a slice more: the next
        slice is asked for while the call still has that much left, so output arriving while
        the reservation is made is covered. Stop the call once its output passes what is
        reserved and no more can be. Callers skip it while the output is at most `due`."""
        ahead = self.slice_tokens / 2
        while output_tokens > self.allowance_tokens - ahead and not self.exhausted:
            granted = await self._grant(self.slice_tokens * self._token_usd)
            more = granted / self._token_usd
            if more < 1:
                self.exhausted = True  # asked once in vain: no more reservations for it
            else:
                self.allowance_tokens += more
        if output_tokens > self.allowance_tokens:
            raise self._refusal(before=False)
        self.due = self.allowance_tokens if self.exhausted else self.allowance_tokens - ahead

    async def _grant(self, want_usd: float) -> float:
        granted = want_usd
        if self.ceiling_left_usd is not None:
            granted = max(0.0, min(granted, self.ceiling_left_usd - self.reserved_usd))
            self.by_ceiling = granted < want_usd
        if self.budget_ids and granted > 0:
            granted = await self.source(self, granted)
        self.reserved_usd += granted
        return granted

    def _refusal(self, *, before: bool) -> BudgetExceeded:
        by_budget = bool(self.budget_ids) and not self.by_ceiling
        what = "a budget" if by_budget else "the run's cost ceiling (max_cost_usd)"
        if before:
            return BudgetExceeded(f"{what} has no room left for this call", by_budget=by_budget)
        return BudgetExceeded(
            f"stopped the answer: {what} has no room left for more output", by_budget=by_budget
        )

    def _held(self) -> dict[str, Any]:
        return {"reservation_id": self.reservation_id, "budget_ids": self.budget_ids}

    def ledger_row(self, call: Call) -> dict[str, Any] | None:
        """The call's ledger entry and the reservation it settles (None if nothing served)."""
        if call.served_by is None or call.cost_usd is None:
            if self.reservation_id is None:
                return None
            return {**self._held(), "cost_usd": 0.0, "served": False}
        return {
            **self._held(),
            "served": True,
            "provider": call.served_by.provider.name,
            "model": call.model or call.served_by.model,
            "input_tokens": call.input_tokens,
            "cached_input_tokens": call.cached_input_tokens,
            "output_tokens": call.output_tokens,
            "cost_usd": call.cost_usd,
            "estimated": call.usage_estimated,
        }


class Spend:
    """Budgets as calls see them: which cover a call, and reservations against them."""

    def __init__(
        self,
        store: Store,
        clock: Callable[[], datetime],
        *,
        slice_tokens: int = DEFAULT_SLICE_TOKENS,
    ) -> None:
        self._store = store
        self._clock = clock
        self.slice_tokens = slice_tokens
        self._budgets: dict[UUID, tuple[float, list[BudgetRecord]]] = {}

    def forget(self, workspace_id: UUID) -> None:
        """Read the workspace's budgets afresh next time (one was added, changed or removed)."""
        self._budgets.pop(workspace_id, None)

    async def _of_workspace(self, workspace_id: UUID) -> list[BudgetRecord]:
        cached = self._budgets.get(workspace_id)
        now = time.monotonic()
        if cached is not None and now - cached[0] < _BUDGETS_TTL_S:
            return cached[1]
        async with self._store.read() as conn:
            found = await budget_store.of_workspace(conn, workspace_id)
        self._budgets[workspace_id] = (now, found)
        return found

    async def covering(
        self,
        workspace_id: UUID,
        *,
        agent_id: UUID | None = None,
        api_key_id: UUID | None = None,
        task_id: UUID | None = None,
    ) -> list[UUID]:
        """The budgets a call made for this agent / with this key / in this task counts in."""
        found = await self._of_workspace(workspace_id)
        if not found:
            return []
        tree: frozenset[UUID] = frozenset()
        if task_id is not None and any(b.task_id is not None for b in found):
            async with self._store.read() as conn:
                tree = await budget_store.task_tree(conn, task_id)
        return [
            b.id for b in found if b.covers(agent_id=agent_id, api_key_id=api_key_id, task_ids=tree)
        ]

    def meter(
        self,
        *,
        workspace_id: UUID,
        chain: Sequence[Target],
        budget_ids: list[UUID],
        ceiling_left_usd: float | None = None,
        run_id: UUID | None = None,
        api_key_id: UUID | None = None,
        source: Source | None = None,
    ) -> Meter:
        """A meter for a call about to be made, reserving from the store or from `source`."""
        deadline = max((t.provider.timeouts.deadline_s for t in chain), default=600.0)
        return Meter(
            source or self.reserve,
            self.slice_tokens,
            workspace_id,
            budget_ids,
            dearest(chain),
            ceiling_left_usd,
            self._clock() + timedelta(seconds=deadline + _EXPIRY_MARGIN_S),
            run_id,
            api_key_id,
        )

    async def start(self, meter: Meter, request: dict[str, Any]) -> None:
        """Reserve the call's prompt and first slice (raises BudgetExceeded when there is no
        room; the caller gives back what `meter` was granted)."""
        max_tokens = request.get("max_tokens") or request.get("max_completion_tokens")
        first = self.slice_tokens
        if isinstance(max_tokens, int) and 0 < max_tokens < first:
            first = max_tokens
        await meter.start(estimate_prompt_tokens(request.get("messages") or ()), first)

    async def open(
        self,
        *,
        workspace_id: UUID,
        chain: Sequence[Target],
        request: dict[str, Any],
        budget_ids: list[UUID],
        ceiling_left_usd: float | None = None,
        run_id: UUID | None = None,
        task_id: UUID | None = None,
    ) -> Meter:
        """Reserve in the store for a call about to be made (raises BudgetExceeded when there
        is no room)."""
        meter = self.meter(
            workspace_id=workspace_id,
            chain=chain,
            budget_ids=budget_ids,
            ceiling_left_usd=ceiling_left_usd,
            run_id=run_id,
        )
        meter.task_id = task_id
        try:
            await self.start(meter, request)
        except BudgetExceeded:
            if meter.reservation_id is not None:  # a part was granted: give it back
                await self.release(meter)
            raise
        return meter

    async def key_budget(self, workspace_id: UUID, api_key_id: UUID | None) -> bool:
        """Whether a budget of the workspace is the budget of this API key."""
        return api_key_id is not None and any(
            b.api_key_id == api_key_id for b in await self._of_workspace(workspace_id)
        )

    async def release(self, meter: Meter) -> None:
        """Give back what a call that never started reserved."""
        assert meter.reservation_id is not None
        async with self._store.write() as conn:
            await budget_store.settle(
                conn, meter.reservation_id, meter.budget_ids, 0.0, self._clock()
            )
        meter.reservation_id = None

    async def reserve(self, meter: Meter, want_usd: float) -> float:
        """Reserve up to `want_usd` more for `meter`'s call; returns what was granted."""
        now = self._clock()
        async with self._store.write() as conn:
            meter.reservation_id, grant = await budget_store.reserve(
                conn,
                workspace_id=meter.workspace_id,
                budget_ids=meter.budget_ids,
                want_usd=want_usd,
                now=now,
                expires_at=meter.expires_at,
                reservation_id=meter.reservation_id,
                run_id=meter.run_id,
                api_key_id=meter.api_key_id,
                override_task_id=meter.task_id,
            )
            await budget_store.record_crossings(conn, meter.workspace_id, grant.crossings, now)
        return grant.granted_usd


class RunSpend:
    """`agents.base.SpendPort` for agent runs: budgets covering the run's workspace, agent and
    task tree, and the run's cost ceiling."""

    def __init__(self, spend: Spend, store: Store) -> None:
        self._spend = spend
        self._store = store

    async def task_spent(self, run: ClaimedRun) -> float:
        """What the agent's runs of this task spent before (every delivery and wake)."""
        async with self._store.read() as conn:
            return await budget_store.task_spend(conn, run.task_id, run.agent_id)

    async def open_call(
        self,
        run: ClaimedRun,
        chain: tuple[Target, ...],
        request: dict[str, Any],
        ceiling_left_usd: float | None,
    ) -> Meter:
        """Reserve for one call of the run."""
        budget_ids = await self._spend.covering(
            run.workspace_id, agent_id=run.agent_id, task_id=run.task_id
        )
        return await self._spend.open(
            workspace_id=run.workspace_id,
            chain=chain,
            request=request,
            budget_ids=budget_ids,
            ceiling_left_usd=ceiling_left_usd,
            run_id=run.id,
            task_id=run.task_id,
        )


@dataclass(slots=True, eq=False)
class _Pool:
    """This process's stock of one set of budgets for relayed calls: one reservation in the
    store, which calls draw from in memory and which is topped up several slices at a time."""

    workspace_id: UUID
    budget_ids: tuple[UUID, ...]
    api_key_id: UUID | None  # the key whose budget is among them, if one is
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    reservation_id: UUID | None = None
    held_usd: float = 0.0  # what the reservation holds, as far as this process knows
    drawn_usd: float = 0.0  # of which calls in flight drew
    inflight: int = 0
    idle_since: float = 0.0
    restock: asyncio.Task[None] | None = None  # the pool's restock, one at a time
    # Until then the store is not asked again: its last top-up could not cover the need.
    dry_until: float = 0.0
    expires_at: datetime | None = None
    closed: bool = False


@dataclass(slots=True, eq=False)
class RelayHold:
    """`gateway.relay.Hold`: a relayed call's meter on its pool."""

    budgets: RelayBudgets
    pool: _Pool
    meter: Meter

    @property
    def due(self) -> float:
        """`need` has nothing to do until the output passes this."""
        return self.meter.due

    async def need(self, output_tokens: int) -> None:
        """Draw more from the pool as output arrives; stop the call when there is none."""
        await self.meter.need(output_tokens)

    def finish(self, call: Call) -> Draw | None:
        """The call ended (once): what it drew and cost, for the ledger batch to settle."""
        return self.budgets.finish(self, call)


class RelayBudgets:
    """Budgets for the relay: each process keeps a pool per set of budgets that covers calls
    (the workspace's, the caller's key's, its agent's), reserved in the store a few slices'
    worth at a time, and the calls draw on it in memory, so a relayed call reaches the
    database only to top the pool up. Its ledger row settles what it drew, in the ledger's
    batch. Everything a pool holds counts as reserved in the store, so every process together
    still never reserves past a budget's amount; near the end of a budget a pool takes at most
    a quarter of what is left beyond its calls' need.

    A pool idle for `idle_s` is given back; a pool's reservation expires `ttl_s` after it was
    last renewed (every `ttl_s / 2` while the process lives). A process that dies leaves its
    pools to expire: the housekeeper then charges each what it held, as estimated spend (the
    bound of what its calls in flight had drawn)."""

    def __init__(
        self,
        spend: Spend,
        store: Store,
        clock: Callable[[], datetime],
        *,
        stock_slices: int = 8,
        idle_s: float = 5.0,
        ttl_s: float = 900.0,
        tick_s: float = 1.0,
    ) -> None:
        self._spend = spend
        self._store = store
        self._clock = clock
        self._stock_slices = stock_slices
        self._idle_s = idle_s
        self._ttl = timedelta(seconds=ttl_s)
        self._tick_s = tick_s
        self._pools: dict[tuple[UUID, tuple[UUID, ...]], _Pool] = {}
        self._task: asyncio.Task[None] | None = None
        self._restocking: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> RelayBudgets:
        self._task = asyncio.create_task(self._tend(), name="relay-budget-pools")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._restocking:
            await asyncio.wait(self._restocking)
        for pool in list(self._pools.values()):
            with contextlib.suppress(BullpenError):
                await self._give_back(pool)

    async def open(
        self, principal: Principal, chain: Sequence[Target], request: dict[str, Any]
    ) -> RelayHold | None:
        """Reserve for a relayed call from its pool (None when no budget covers it)."""
        budget_ids = await self._spend.covering(
            principal.workspace_id, agent_id=principal.agent_id, api_key_id=principal.api_key_id
        )
        if not budget_ids:
            return None
        key = (principal.workspace_id, tuple(sorted(budget_ids)))
        pool = self._pools.get(key)
        if pool is None:
            own_key = await self._spend.key_budget(principal.workspace_id, principal.api_key_id)
            pool = self._pools.setdefault(
                key,
                _Pool(principal.workspace_id, key[1], principal.api_key_id if own_key else None),
            )
        pool.inflight += 1
        meter = self._spend.meter(
            workspace_id=principal.workspace_id,
            chain=chain,
            budget_ids=list(key[1]),
            api_key_id=principal.api_key_id,
            source=functools.partial(self._draw, pool),
        )
        try:
            await self._spend.start(meter, request)
        except BaseException:
            pool.drawn_usd -= meter.reserved_usd  # what a refused call was granted stays
            self._left(pool)
            raise
        return RelayHold(self, pool, meter)

    async def _draw(self, pool: _Pool, meter: Meter, want_usd: float) -> float:
        """Up to `want_usd` from the pool for `meter`'s call, topping the pool up if short.

        Once a top-up could not cover its need, the budgets are spent: for a tick the calls
        short of room take what the pool holds without asking the store again. Otherwise each
        call queued on the pool's lock waits its own transaction to be told so, reading nothing
        of its stream meanwhile, and what its provider streams in that time is owed."""
        # Stock for every call in flight: each draws a slice at a time, and a top-up (a
        # transaction) must come before the stock runs out, or the calls wait on it.
        stock = want_usd * self._stock_slices * max(1, pool.inflight)
        if pool.held_usd - pool.drawn_usd < want_usd and not self._dry(pool):
            async with pool.lock:
                short = want_usd - (pool.held_usd - pool.drawn_usd)
                if short > 0 and not self._dry(pool):
                    await self._top_up(pool, short, stock)
        granted = max(0.0, min(want_usd, pool.held_usd - pool.drawn_usd))
        pool.drawn_usd += granted
        restocking = pool.restock is not None and not pool.restock.done()
        if granted and pool.held_usd - pool.drawn_usd < stock / 2 and not restocking:
            # Restock ahead, off this call's path: calls waiting on a top-up read nothing, and
            # what their providers stream meanwhile arrives in one large read.
            task = asyncio.create_task(self._restock(pool, stock), name="relay-budget-restock")
            pool.restock = task
            self._restocking.add(task)
            task.add_done_callback(self._restocking.discard)
        return granted

    def _dry(self, pool: _Pool) -> bool:
        return time.monotonic() < pool.dry_until

    async def _restock(self, pool: _Pool, stock_usd: float) -> None:
        try:
            async with pool.lock:
                if not pool.closed and pool.held_usd - pool.drawn_usd < stock_usd / 2:
                    await self._top_up(pool, 0.0, stock_usd)
        except BullpenError as err:  # the database is away: the next draw tries again
            log.warning("could not restock a relay budget pool: %s", err.detail)

    async def _top_up(self, pool: _Pool, need_usd: float, stock_usd: float) -> None:
        now = self._clock()
        expires_at = now + self._ttl
        async with self._store.write() as conn:
            pool.reservation_id, grant = await budget_store.reserve(
                conn,
                workspace_id=pool.workspace_id,
                budget_ids=pool.budget_ids,
                want_usd=max(need_usd, stock_usd),
                need_usd=need_usd,
                now=now,
                expires_at=expires_at,
                reservation_id=pool.reservation_id,
                api_key_id=pool.api_key_id,
            )
            await budget_store.record_crossings(conn, pool.workspace_id, grant.crossings, now)
        pool.held_usd += grant.granted_usd
        if grant.granted_usd < need_usd - EPSILON_USD:
            pool.dry_until = time.monotonic() + self._tick_s
        if pool.reservation_id is not None:
            pool.expires_at = expires_at

    def finish(self, hold: RelayHold, call: Call) -> Draw | None:
        """A relayed call ended: it leaves the pool with what it cost (at most what it drew);
        what it drew beyond that stays for the next calls."""
        pool, drawn = hold.pool, hold.meter.reserved_usd
        cost = (call.cost_usd or 0.0) if call.served_by is not None else 0.0
        moved = min(cost, drawn)
        pool.drawn_usd -= drawn
        pool.held_usd -= moved
        self._left(pool)
        if pool.reservation_id is None or cost <= 0:
            return None  # nothing to move into the spend: what it drew stays in the pool
        return Draw(pool.workspace_id, pool.reservation_id, pool.budget_ids, drawn, cost)

    def _left(self, pool: _Pool) -> None:
        pool.inflight -= 1
        if pool.inflight == 0:
            pool.idle_since = time.monotonic()

    async def _tend(self) -> None:
        """Give back pools left idle; renew the reservations of pools in use."""
        while True:
            await asyncio.sleep(self._tick_s)
            idle_before = time.monotonic() - self._idle_s
            renew_before = self._clock() + self._ttl / 2
            for pool in list(self._pools.values()):
                try:
                    if pool.inflight == 0 and pool.idle_since < idle_before:
                        await self._give_back(pool)
                    elif pool.expires_at is not None and pool.expires_at < renew_before:
                        await self._renew(pool)
                except BullpenError as err:  # the database is away: next tick
                    log.warning("could not tend a relay budget pool: %s", err.detail)

    async def _give_back(self, pool: _Pool) -> None:
        async with pool.lock:
            if pool.inflight:
                return
            self._pools.pop((pool.workspace_id, pool.budget_ids), None)
            pool.closed = True
            if pool.reservation_id is None:
                return
            async with self._store.write() as conn:
                await budget_store.settle(
                    conn, pool.reservation_id, pool.budget_ids, 0.0, self._clock()
                )

    async def _renew(self, pool: _Pool) -> None:
        async with pool.lock:
            if pool.closed or pool.reservation_id is None:
                return
            expires_at = self._clock() + self._ttl
            async with self._store.write() as conn:
                await budget_store.renew(conn, pool.reservation_id, expires_at)
            pool.expires_at = expires_at
