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

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from bullpen.domain.budgets import EPSILON_USD, BudgetRecord
from bullpen.domain.runs import ClaimedRun
from bullpen.errors import BudgetExceeded
from bullpen.gateway.catalog import Price, Target
from bullpen.gateway.router import Call, estimate_prompt_tokens
from bullpen.store import budgets as budget_store
from bullpen.store.base import Store

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


@dataclass(slots=True)
class Meter:
    """One call's hold on its budgets and ceiling while it streams."""

    spend: Spend
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
    prompt_usd: float = 0.0
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

    async def need(self, output_tokens: int) -> None:
        """Make sure `output_tokens` of output are reserved; stop the call if they cannot be."""
        while output_tokens > self.allowance_tokens:
            granted = await self._grant(self.spend.slice_tokens * self._token_usd)
            more = granted / self._token_usd
            if more < 1:
                raise self._refusal(before=False)
            self.allowance_tokens += more

    async def _grant(self, want_usd: float) -> float:
        granted = want_usd
        if self.ceiling_left_usd is not None:
            granted = max(0.0, min(granted, self.ceiling_left_usd - self.reserved_usd))
        if self.budget_ids and granted > 0:
            granted = await self.spend.reserve(self, granted)
        self.reserved_usd += granted
        return granted

    def _refusal(self, *, before: bool) -> BudgetExceeded:
        what = "a budget" if self.budget_ids else "the run's cost ceiling (max_cost_usd)"
        if before:
            return BudgetExceeded(f"{what} has no room left for this call")
        return BudgetExceeded(f"stopped the answer: {what} has no room left for more output")

    def ledger_row(self, call: Call) -> dict[str, Any] | None:
        """The call's ledger entry and the reservation it settles (None if nothing served)."""
        if call.served_by is None or call.cost_usd is None:
            if self.reservation_id is None:
                return None
            return {"reservation_id": self.reservation_id, "cost_usd": 0.0, "served": False}
        return {
            "reservation_id": self.reservation_id,
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

    async def open(
        self,
        *,
        workspace_id: UUID,
        chain: Sequence[Target],
        request: dict[str, Any],
        budget_ids: list[UUID],
        ceiling_left_usd: float | None = None,
        run_id: UUID | None = None,
        api_key_id: UUID | None = None,
    ) -> Meter:
        """Reserve for a call about to be made (raises BudgetExceeded when there is no room)."""
        deadline = max((t.provider.timeouts.deadline_s for t in chain), default=600.0)
        meter = Meter(
            self,
            workspace_id,
            budget_ids,
            dearest(chain),
            ceiling_left_usd,
            self._clock() + timedelta(seconds=deadline + _EXPIRY_MARGIN_S),
            run_id,
            api_key_id,
        )
        max_tokens = request.get("max_tokens") or request.get("max_completion_tokens")
        first = self.slice_tokens
        if isinstance(max_tokens, int) and 0 < max_tokens < first:
            first = max_tokens
        try:
            await meter.start(estimate_prompt_tokens(request.get("messages") or ()), first)
        except BudgetExceeded:
            if meter.reservation_id is not None:  # a part was granted: give it back
                await self.release(meter)
            raise
        return meter

    async def release(self, meter: Meter) -> None:
        """Give back what a call that never started reserved."""
        assert meter.reservation_id is not None
        async with self._store.write() as conn:
            await budget_store.settle(conn, meter.reservation_id, 0.0, self._clock())
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
        )
