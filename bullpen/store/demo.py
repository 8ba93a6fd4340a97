"""A demo workspace of any size, written straight into the tables: an org chart of agents,
providers and routes, routines, budgets, and weeks of history (tasks and subtasks, their runs
and run events, costs, approvals, comments, audit events).

For the `ui` bench (100,000 tasks and a million run events in a minute or two, not hours
through the API) and the dashboard's screenshots. Rows are made as Bullpen makes them (the
same columns, statuses that agree between a task and its run, gap-free event `seq`s, costs
from the providers' prices) but no service runs: nothing is queued for real, no notice sent.
Deterministic for a given `seed`, apart from the ids.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4
from zoneinfo import ZoneInfo

import sqlalchemy as sa
from cronsim import CronSim
from sqlalchemy.ext.asyncio import AsyncEngine

from bullpen.store import rollups
from bullpen.store import tasks as task_store
from bullpen.store.base import Connection, Store
from bullpen.store.tables import (
    agents,
    approvals,
    audit_events,
    budgets,
    cost_events,
    model_routes,
    providers,
    routines,
    run_events,
    runs,
    task_comments,
    tasks,
    users,
    workspaces,
)

CHUNK = 2_000  # tasks written per transaction, with their runs, events and ledger rows
#: Words the bench searches for: in about half of the tasks, in about one in a thousand, in none.
SEARCH_COMMON, SEARCH_RARE, SEARCH_NONE = "revenue", "vandelay", "xylophone"

_VERBS = ["Analyze", "Summarize", "Forecast", "Audit", "Draft", "Review", "Reconcile", "Extract"]
_SUBJECTS = [
    "Q3 revenue",
    "churn by cohort",
    "support tickets",
    "invoice anomalies",
    "marketing spend",
    "the hiring pipeline",
    "cloud costs",
    "NPS comments",
    "revenue by region",
    "the release notes",
]
_CUSTOMERS = ["Acme Corp", "Globex", "Initech", "Umbrella", "Hooli", "Stark Industries", "Soylent"]
_SENTENCES = [
    "Analyze this dataset and extract key metrics.",
    "Compare the numbers with the previous quarter and flag anything that moved by more "
    "than ten percent.",
    "Keep the summary under 300 words and cite the rows you used.",
    "List the three most likely causes and how to check each one.",
    "The CSV export is attached to the ticket; ignore the test accounts.",
    "Write the answer for the board: plain words, no jargon.",
    "Break the revenue down by product line and by month.",
    "If the data is incomplete, say which columns are missing before guessing.",
]
_LABELS = ["finance", "ops", "research", "urgent", "customer", "weekly"]
_ROLES = [
    ("analyst", "Data analyst"),
    ("researcher", "Researcher"),
    ("writer", "Technical writer"),
    ("reviewer", "Reviewer"),
    ("support", "Support agent"),
    ("ops", "Operations agent"),
    ("finance", "Finance analyst"),
    ("planner", "Planner"),
]
_ANSWER = (
    "Revenue grew 12% quarter on quarter, led by the enterprise plan (+18%). Churn held at "
    "2.1%. Two anomalies: duplicate invoices on 3 and 17 September (refunded), and a spike "
    "of support tickets after the 2.4 release."
)
_PROVIDERS = [
    (
        "openai",
        "https://api.openai.com/v1",
        [("gpt-4o", 2.5, 1.25, 10.0), ("gpt-4o-mini", 0.15, 0.075, 0.6)],
    ),
    ("anthropic", "https://api.anthropic.com/v1", [("claude-sonnet", 3.0, 0.3, 15.0)]),
    ("local-vllm", "http://10.0.0.12:8000/v1", [("llama-3.1-70b", 0.0, 0.0, 0.0)]),
]
_ROUTES = {
    "smart": [("openai", "gpt-4o"), ("anthropic", "claude-sonnet")],
    "cheap": [("openai", "gpt-4o-mini"), ("local-vllm", "llama-3.1-70b")],
}
_ROUTINES = [
    ("weekly-revenue", "0 8 * * 1", "Europe/Paris", "Weekly revenue summary"),
    ("nightly-anomalies", "30 2 * * *", "UTC", "Invoice anomalies of the day"),
    ("monthly-close", "0 9 1 * *", "America/New_York", "Month-end close checklist"),
    ("ticket-digest", "0 17 * * 1-5", "Europe/Berlin", "Support ticket digest"),
    ("cost-review", "0 10 * * 5", "UTC", "Cloud cost review"),
    ("quarterly-board", "0 9 1 1,4,7,10 *", "UTC", "Board pack draft"),
]


@dataclass(frozen=True, slots=True)
class DemoSize:
    """How much to make."""

    tasks: int = 100_000
    events: int = 1_000_000
    agents: int = 200
    days: int = 30  # the history's length, ending a minute before `now`

    def __post_init__(self) -> None:
        if self.tasks < 1 or self.events < 0 or self.agents < 1 or self.days < 1:
            raise ValueError("tasks, agents and days must be >= 1, events >= 0")


@dataclass(slots=True)
class Seeded:
    """What was made: counts per table, and ids the bench and the screenshots open."""

    workspace_id: UUID
    counts: dict[str, int] = field(default_factory=dict)
    task_id: UUID | None = None  # a recent top-level task with subtasks, tools and comments
    agent_id: UUID | None = None  # the org chart's root
    provider_id: UUID | None = None  # a provider, with its models and prices
    routine_id: UUID | None = None  # a routine, with its fires
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """As JSON."""
        return {
            "workspace_id": str(self.workspace_id),
            "task_id": str(self.task_id),
            "agent_id": str(self.agent_id),
            "provider_id": str(self.provider_id),
            "routine_id": str(self.routine_id),
            "search_common": SEARCH_COMMON,
            "search_rare": SEARCH_RARE,
            "search_none": SEARCH_NONE,
            "counts": self.counts,
            "seconds": round(self.seconds, 1),
        }


def _id_at(when: datetime) -> UUID:
    """A UUIDv7 of `when` (store.ids makes them of now): rows sort by id as by creation."""
    ms = int(when.timestamp() * 1000)
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | ((rand >> 62) & 0xFFF) << 64
    return UUID(int=value | 0b10 << 62 | (rand & ((1 << 62) - 1)))


class _Maker:
    """Builds the rows; `rng` decides everything but the ids."""

    def __init__(
        self, workspace_id: UUID, key: str, user_id: UUID, now: datetime, seed: int, days: int
    ) -> None:
        self.ws, self.key, self.user, self.now = workspace_id, key, user_id, now
        self.span = timedelta(days=days)
        self.rng = random.Random(seed)  # noqa: S311 - demo data, not a secret
        self.prices: dict[tuple[str, str], tuple[float, float]] = {
            (name, model): (inp, out)
            for name, _, models in _PROVIDERS
            for model, inp, _, out in models
        }
        self.month_start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        self.month_spend: dict[UUID, float] = {}

    def audit(
        self, action: str, target: str, target_id: UUID | None, at: datetime
    ) -> dict[str, Any]:
        return {
            "id": _id_at(at),
            "workspace_id": self.ws,
            "actor_type": "user",
            "actor_id": self.user,
            "action": action,
            "target_type": target,
            "target_id": target_id,
            "data": {},
            "created_at": at,
        }

    def agents(self, count: int, root: UUID) -> list[dict[str, Any]]:
        """`count` agents under the existing `root`, five reports each (breadth first)."""
        rows: list[dict[str, Any]] = []
        at = self.now - self.span - timedelta(days=1)
        for i in range(count):
            name, title = _ROLES[i % len(_ROLES)]
            manager = root if i < 5 else rows[(i - 5) // 5]["id"]
            status = "paused" if i % 41 == 40 else "terminated" if i % 97 == 96 else "active"
            gated = i % 20 == 7 and status == "active"
            rows.append(
                {
                    "id": uuid4(),
                    "workspace_id": self.ws,
                    "name": f"{name}-{i + 1:03d}",
                    "title": title,
                    "adapter": "llm",
                    "config": {"model": "smart" if i % 3 else "cheap"},
                    "status": status,
                    "max_concurrent_runs": 10,
                    "created_at": at + timedelta(minutes=i),
                    "reports_to": manager,
                    "description": f"{title} of the demo team.",
                    "requires_approval": gated,
                    "failures_in_a_row": 0,
                    "paused_reason": "paused by an admin" if status == "paused" else None,
                }
            )
        return rows

    def text(self, rare: bool) -> tuple[str, str]:
        rng = self.rng
        customer = "Vandelay Industries" if rare else rng.choice(_CUSTOMERS)
        title = f"{rng.choice(_VERBS)} {rng.choice(_SUBJECTS)} for {customer}"
        body = " ".join(rng.sample(_SENTENCES, rng.randint(2, 6)))
        return title, f"{title}. {body}"


def _spread(total: int, parts: int) -> Iterator[int]:
    """`total` split over `parts` as evenly as whole numbers allow."""
    base, extra = divmod(total, parts) if parts else (0, 0)
    for i in range(parts):
        yield base + (1 if i < extra else 0)


async def seed_demo(
    store: Store,
    workspace_id: UUID,
    *,
    size: DemoSize = DemoSize(),
    now: datetime | None = None,
    seed: int = 7,
) -> Seeded:
    """Fill `workspace_id` (which has an admin and an agent, as `bullpen init` leaves it)."""
    started = time.monotonic()
    now = now or datetime.now(UTC)
    async with store.read() as conn:
        ws = (
            await conn.execute(sa.select(workspaces).where(workspaces.c.id == workspace_id))
        ).one()
        user_id = (
            await conn.execute(sa.select(users.c.id).order_by(users.c.created_at))
        ).scalar_one()
        root = (
            (
                await conn.execute(
                    sa.select(agents.c.id)
                    .where(agents.c.workspace_id == workspace_id)
                    .order_by(agents.c.created_at)
                )
            )
            .scalars()
            .first()
        )
    if root is None:
        raise ValueError("the workspace has no agent to put at the top of the org chart")
    make = _Maker(workspace_id, str(ws.task_key), user_id, now, seed, size.days)
    out = Seeded(workspace_id, agent_id=root)
    counts = out.counts
    team = make.agents(size.agents - 1, root)
    active = [a for a in team if a["status"] == "active" and not a["requires_approval"]]
    gated = [a for a in team if a["requires_approval"]]
    runnable = [a["id"] for a in active] or [root]
    async with store.write() as conn:
        if team:
            await conn.execute(agents.insert(), team)
        out.provider_id, out.routine_id = await _setup(conn, make, [a["id"] for a in team])
    counts["agents"] = size.agents
    # The newest tasks: 3 running, 3 queued (no event yet), 6 awaiting approval (no run) when
    # an agent is gated; every other run has events, the total spread over them.
    eventless = min(3, max(0, size.tasks - 3)) + (min(6, max(0, size.tasks - 6)) if gated else 0)
    per_run = _spread(size.events, max(1, size.tasks - eventless))
    number = int(ws.task_counter)
    first = now - make.span - timedelta(minutes=1)
    step = make.span / size.tasks
    sample_parent: tuple[UUID, bool] | None = None
    for start in range(0, size.tasks, CHUNK):
        rows: dict[str, list[dict[str, Any]]] = {
            k: [] for k in ("tasks", "runs", "events", "costs", "approvals", "comments", "audit")
        }
        parents: list[dict[str, Any]] = []
        for i in range(start, min(start + CHUNK, size.tasks)):
            at = first + step * i + timedelta(milliseconds=make.rng.randint(0, 900))
            age = size.tasks - i  # 1: the newest
            number += 1
            rng = make.rng
            title, prompt = make.text(rare=rng.random() < 0.001 or i == size.tasks // 2)
            status = (
                "running"
                if age <= 3
                else "queued"
                if age <= 6
                else "awaiting_approval"
                if age <= 12 and gated
                else "failed"
                if rng.random() < 0.08
                else "cancelled"
                if rng.random() < 0.05
                else "done"
            )
            agent = (
                rng.choice([a["id"] for a in gated])
                if status == "awaiting_approval"
                else rng.choice(runnable)
            )
            parent = parents[-1] if parents and rng.random() < 0.15 else None
            task = {
                "id": _id_at(at),
                "workspace_id": workspace_id,
                "number": number,
                "title": title,
                "prompt": prompt,
                "agent_id": agent,
                "creator_user_id": None if parent else user_id,
                "creator_key_id": None,
                "status": status,
                "priority": rng.choice([0, 0, 0, 1, 5]),
                "labels": rng.sample(_LABELS, rng.choice([0, 1, 1, 2])),
                "result": _ANSWER if status == "done" else None,
                "error": {
                    "failed": "the provider failed: HTTP 503",
                    "cancelled": "cancelled on request",
                }.get(status),
                "created_at": at,
                "updated_at": at,
                "parent_id": parent["id"] if parent else None,
                "origin_key": f"{parent['dependencies']}.0" if parent else None,
                "blocks_parent": True,
                "dependencies": 0,
                "dependents": 0,
                "steps": 0,
                "budget_override_usd": None,
                "elapsed_s": 0.0,
            }
            delegates = parent is None and rng.random() < 0.2
            if parent:
                parent["dependencies"] += 1
            elif delegates:
                parents.append(task)
            rows["tasks"].append(task)
            rows["audit"].append(make.audit("task.create", "task", task["id"], at))
            if status == "awaiting_approval":
                rows["approvals"].append(_approval(make, task, "pending", at))
                continue
            events = 0 if status == "queued" else next(per_run)
            _run(make, task, events, rows, tools=delegates)
            if status == "cancelled":
                rows["audit"].append(
                    make.audit("task.cancel", "task", task["id"], task["updated_at"])
                )
            if rng.random() < 0.01:
                decided = _approval(
                    make, task, "approved" if status != "cancelled" else "denied", at
                )
                rows["approvals"].append(decided)
                rows["audit"].append(
                    make.audit(
                        f"approval.{'approve' if status != 'cancelled' else 'deny'}",
                        "approval",
                        decided["id"],
                        at,
                    )
                )
            if rng.random() < (0.5 if delegates else 0.01):
                rows["comments"].append(
                    {
                        "id": _id_at(task["updated_at"]),
                        "workspace_id": workspace_id,
                        "task_id": task["id"],
                        "author_type": "user",
                        "author_id": user_id,
                        "body": "Looks right. Please add the September numbers next time.",
                        "created_at": task["updated_at"],
                        "origin_key": None,
                    }
                )
        async with store.write() as conn:
            for table, key in (
                (tasks, "tasks"),
                (runs, "runs"),
                (run_events, "events"),
                (cost_events, "costs"),
                (approvals, "approvals"),
                (task_comments, "comments"),
                (audit_events, "audit"),
            ):
                if rows[key]:
                    await conn.execute(table.insert(), rows[key])
                    counts[key] = counts.get(key, 0) + len(rows[key])
            # The rollups of the rows just written, as the ledger and the runs' ends keep them.
            await rollups.add_costs(conn, rows["costs"])
            await rollups.add_ttfts(
                conn,
                (
                    (run["workspace_id"], run["started_at"], run["ttft_ms"])
                    for run in rows["runs"]
                    if run["ttft_ms"] is not None and run["started_at"] is not None
                ),
            )
        # The page to show of a task: the newest that is done and has subtasks, a tool call
        # and, if it can be, a comment.
        commented = {c["task_id"] for c in rows["comments"]}
        for task in parents:
            if task["status"] == "done" and task["dependencies"] >= 2:
                if sample_parent is None or sample_parent[1] <= (task["id"] in commented):
                    sample_parent = (task["id"], task["id"] in commented)
        # SQLite: the WAL would grow by the whole seed (gigabytes) before the store's own
        # checkpoints, which wait their turn on this loop, ran.
        await store.checkpoint()
    # SQLite: every seeded task into the search's index now, not over the first minutes.
    await task_store.index_all_pending(store)
    async with store.write() as conn:
        await conn.execute(
            workspaces.update().where(workspaces.c.id == workspace_id).values(task_counter=number)
        )
        await _budgets(conn, make, [a["id"] for a in team[:40]])
    if store.dialect == "postgresql":
        # As autovacuum would soon after a bulk load: planner statistics (without them the
        # search planned a scan of every task, 1.3 s) and the GIN indexes' pending lists
        # merged (a trigram lookup went from 8 ms to 0.07).
        assert isinstance(store.engine, AsyncEngine)
        async with store.engine.connect() as conn:
            outside = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await outside.exec_driver_sql("VACUUM ANALYZE")  # never in a transaction
    # Few tasks: perhaps none has subtasks.
    out.task_id = sample_parent[0] if sample_parent else rows["tasks"][-1]["id"]
    out.seconds = time.monotonic() - started
    return out


def _approval(make: _Maker, task: dict[str, Any], status: str, at: datetime) -> dict[str, Any]:
    decided = status != "pending"
    return {
        "id": _id_at(at),
        "workspace_id": make.ws,
        "kind": "task",
        "status": status,
        "task_id": task["id"],
        "agent_id": task["agent_id"],
        "run_id": None,
        "step": None,
        "subject": {"title": task["title"], "number": f"{make.key}-{task['number']}"},
        "default_outcome": "deny",
        "expires_at": make.now + timedelta(days=7),
        "reason": ("Numbers checked." if status == "approved" else "Not this quarter.")
        if decided
        else None,
        "decided_at": at + timedelta(minutes=3) if decided else None,
        "decided_by_user_id": make.user if decided else None,
        "decided_by_key_id": None,
        "created_at": at,
    }


def _run(
    make: _Maker,
    task: dict[str, Any],
    events: int,
    rows: dict[str, list[dict[str, Any]]],
    *,
    tools: bool,
) -> None:
    """The task's run, its `events` run events and its cost, as its status says."""
    rng, status, at = make.rng, task["status"], task["created_at"]
    ended = status in ("done", "failed", "cancelled")
    route = _ROUTES["smart" if rng.random() < 0.7 else "cheap"]
    provider, model = route[0]
    fell_back = rng.random() < 0.03
    if fell_back:
        provider, model = route[1]
    started = at + timedelta(milliseconds=rng.randint(20, 400))
    ttft = rng.uniform(250, 1200)
    duration = ttft + rng.uniform(500, 9000)
    finished = started + timedelta(milliseconds=duration) if ended else None
    tokens_in, tokens_out = rng.randint(200, 3000), rng.randint(50, 900)
    price_in, price_out = make.prices[(provider, model)]
    cost = round((tokens_in * price_in + tokens_out * price_out) / 1e6, 6) if ended else None
    calls = (
        [
            {
                "provider": route[0][0],
                "model": route[0][1],
                "outcome": "failed",
                "reason": "http_503",
                "detail": None,
                "ttft_ms": None,
                "duration_ms": 120.0,
                "input_tokens": None,
                "output_tokens": None,
            }
        ]
        if fell_back
        else []
    )
    if status != "queued":
        calls.append(
            {
                "provider": provider,
                "model": model,
                "outcome": "ok" if status != "failed" else "failed",
                "reason": None if status != "failed" else "http_503",
                "detail": None,
                "ttft_ms": round(ttft, 1),
                "duration_ms": round(duration, 1),
                "input_tokens": tokens_in,
                "output_tokens": tokens_out,
            }
        )
    run = {
        "id": _id_at(at),
        "workspace_id": make.ws,
        "task_id": task["id"],
        "agent_id": task["agent_id"],
        "status": status,
        "attempt": 0,
        "lease_owner": "demo-worker" if status == "running" else None,
        "lease_expires_at": make.now + timedelta(days=1) if status == "running" else None,
        "queued_at": at,
        "started_at": None if status == "queued" else started,
        "first_token_at": None if status == "queued" else started + timedelta(milliseconds=ttft),
        "finished_at": finished,
        "ttft_ms": round(ttft, 1) if ended else None,  # recorded as a run ends
        "provider": None if status == "queued" else provider,
        "model": None if status == "queued" else model,
        "input_tokens": tokens_in if ended else None,
        "output_tokens": tokens_out if ended else None,
        "error": task["error"],
        "priority": task["priority"],
        "available_at": None,
        "failures": 0,
        "lost_leases": 0,
        "cancel_requested_at": None,
        "error_code": "provider_unavailable" if status == "failed" else None,
        "cost_usd": cost,
        "llm_calls": calls or None,
        "trace_parent": None,
    }
    rows["runs"].append(run)
    if finished is not None:
        task["updated_at"] = finished
        task["elapsed_s"] = round(duration / 1000, 3)
    if cost:
        if finished is not None and finished >= make.month_start:
            make.month_spend[task["agent_id"]] = make.month_spend.get(task["agent_id"], 0.0) + cost
        rows["costs"].append(
            {
                "id": _id_at(finished or at),
                "workspace_id": make.ws,
                "run_id": run["id"],
                "agent_id": task["agent_id"],
                "user_id": None,
                "api_key_id": None,
                "provider": provider,
                "model": model,
                "input_tokens": tokens_in,
                "cached_input_tokens": 0,
                "output_tokens": tokens_out,
                "cost_usd": cost,
                "created_at": finished or at,
                "task_id": task["id"],
                "source": "run",
                "estimated": False,
            }
        )
    if status == "queued" or events == 0:
        return
    opening: list[tuple[str, dict[str, Any]]] = [("status", {"status": "running", "attempt": 0})]
    if tools and events >= 5:
        arguments = {"agent": "analyst-001", "prompt": "Dig into the numbers"}
        opening.append(("tool_call", {"step": 1, "name": "delegate", "arguments": arguments}))
        opening.append(("tool_result", {"step": 1, "name": "delegate", "result": "created"}))
    closing = [("end", {"status": status})] if ended else []
    words = _ANSWER.split(" ")
    pieces = max(0, events - len(opening) - len(closing))
    # The answer over the text events: all of it in order, or (more events) again and again.
    per = max(1, -(-len(words) // pieces)) if pieces else 1
    texts = [
        ("text", {"text": " ".join(words[(n * per) % len(words) :][:per]) + " "})
        for n in range(pieces)
    ]
    kinds = (opening + texts)[: max(0, events - len(closing))] + closing[:events]
    span = (finished or make.now) - started
    for seq, (kind, data) in enumerate(kinds, start=1):
        rows["events"].append(
            {
                "run_id": run["id"],
                "seq": seq,
                "workspace_id": make.ws,
                "task_id": task["id"],
                "kind": kind,
                "data": data,
                "created_at": started + span * (seq / len(kinds)),
            }
        )


async def _setup(
    conn: Connection, make: _Maker, team: list[UUID]
) -> tuple[UUID | None, UUID | None]:
    """Providers, routes, routines and their audit events; the first provider's and the
    first routine's ids."""
    at = make.now - make.span - timedelta(days=2)
    made = []
    first: list[UUID] = []
    for name, url, models in _PROVIDERS:
        provider_id = uuid4()
        first.append(provider_id)
        row = {
            "id": provider_id,
            "workspace_id": make.ws,
            "name": name,
            "base_url": url,
            "api_key_ciphertext": None,
            "api_key_hint": None,
            "models": [
                {"name": m, "input_per_mtok": i, "cached_input_per_mtok": c, "output_per_mtok": o}
                for m, i, c, o in models
            ],
            "connect_timeout_s": 5.0,
            "ttft_timeout_s": 30.0,
            "idle_timeout_s": 30.0,
            "deadline_s": 600.0,
            "created_at": at,
            "updated_at": at,
        }
        await conn.execute(providers.insert(), [row])
        made.append(make.audit("provider.create", "provider", provider_id, at))
    for name, chain in _ROUTES.items():
        route_id: UUID = uuid4()
        await conn.execute(
            model_routes.insert(),
            [
                {
                    "id": route_id,
                    "workspace_id": make.ws,
                    "name": name,
                    "chain": [{"provider": p, "model": m} for p, m in chain],
                    "created_at": at,
                    "updated_at": at,
                }
            ],
        )
        made.append(make.audit("route.create", "route", route_id, at))
    owners = team or []
    for i, (name, cron, zone, title) in enumerate(_ROUTINES):
        if not owners:
            break
        enabled = i % 3 != 2
        routine_id = uuid4()
        first.append(routine_id)
        nxt = next(CronSim(cron, make.now.astimezone(ZoneInfo(zone)))).astimezone(UTC)
        await conn.execute(
            routines.insert(),
            [
                {
                    "id": routine_id,
                    "workspace_id": make.ws,
                    "name": name,
                    "agent_id": owners[i % len(owners)],
                    "cron": cron,
                    "timezone": zone,
                    "title": title,
                    "prompt": f"{title}: {_SENTENCES[0]}",
                    "priority": 0,
                    "labels": ["weekly"] if "* 1" in cron else [],
                    "concurrency": "skip",
                    "catch_up": "latest",
                    "enabled": enabled,
                    "next_fire_at": nxt if enabled else None,
                    "last_task_id": None,
                    "creator_user_id": make.user,
                    "creator_key_id": None,
                    "created_at": at,
                    "updated_at": at,
                }
            ],
        )
        made.append(make.audit("routine.create", "routine", routine_id, at))
    made += [make.audit("agent.create", "agent", agent_id, at) for agent_id in team]
    if made:
        await conn.execute(audit_events.insert(), made)
    routine = first[len(_PROVIDERS)] if len(first) > len(_PROVIDERS) else None
    return (first[0] if _PROVIDERS else None), routine


async def _budgets(conn: Connection, make: _Maker, team: list[UUID]) -> None:
    """A monthly budget for the workspace and for some agents, with this month's spend."""
    rows = []
    for agent_id in [None, *team]:
        spent = (
            sum(make.month_spend.values())
            if agent_id is None
            else make.month_spend.get(agent_id, 0.0)
        )
        rows.append(
            {
                "id": uuid4(),
                "workspace_id": make.ws,
                "scope": "workspace" if agent_id is None else "agent",
                "agent_id": agent_id,
                "api_key_id": None,
                "task_id": None,
                "amount_usd": round(max(spent * 1.6, 5.0), 0),
                "period": "month",
                "timezone": "UTC",
                "warn_percent": 80,
                "hard_stop": agent_id is not None,
                "period_start": make.month_start,
                "spent_usd": round(spent, 6),
                "reserved_usd": 0.0,
                "warned": False,
                "exceeded": False,
                "created_at": make.now - make.span,
                "updated_at": make.now,
            }
        )
    await conn.execute(budgets.insert(), rows)
