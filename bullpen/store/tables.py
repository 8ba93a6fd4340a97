"""The schema, as SQLAlchemy Core tables; migrations in `store/migrations` must match it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

from bullpen.domain.agents import AgentStatus

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(column_0_label)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)


class UTCDateTime(sa.TypeDecorator[datetime]):
    """Timezone-aware UTC timestamps on both backends (SQLite stores them naive)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# Nothing here names the PostgreSQL dialect: that import alone (all its drivers' modules) is
# about 5 MB of a SQLite server's memory. So the partial indexes below state only SQLite's
# predicate; their migrations create them on PostgreSQL with the same one, and the store
# contract suite checks each predicate on both backends.


class JSONDocument(sa.types.TypeDecorator[Any]):
    """JSON: JSONB on PostgreSQL, JSON text on SQLite.

    The PostgreSQL type is looked up when a PostgreSQL engine first uses the column, so a
    SQLite server never imports that dialect (about 5 MB of its memory).
    """

    impl = sa.JSON
    cache_ok = True
    # As `sa.JSON()`: Python's None is stored as JSON `null`, not as SQL NULL.
    should_evaluate_none = True

    def load_dialect_impl(self, dialect: Dialect) -> sa.types.TypeEngine[Any]:
        if dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import JSONB

            return dialect.type_descriptor(JSONB())
        return dialect.type_descriptor(sa.JSON())


JSONType: sa.types.TypeEngine[Any] = JSONDocument()


def _id() -> sa.Column[Any]:
    return sa.Column("id", sa.Uuid, primary_key=True)


def _created() -> sa.Column[Any]:
    return sa.Column("created_at", UTCDateTime, nullable=False)


def _workspace_fk() -> sa.Column[Any]:
    return sa.Column(
        "workspace_id", sa.Uuid, sa.ForeignKey("workspaces.id", ondelete="CASCADE"), nullable=False
    )


workspaces = sa.Table(
    "workspaces",
    metadata,
    _id(),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("slug", sa.String(64), nullable=False, unique=True),
    sa.Column("task_key", sa.String(10), nullable=False),
    sa.Column("task_counter", sa.BigInteger, nullable=False, server_default="0"),
    _created(),
)

users = sa.Table(
    "users",
    metadata,
    _id(),
    sa.Column("email", sa.String(320), nullable=False, unique=True),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("password_hash", sa.String(255), nullable=False),
    sa.Column("is_instance_admin", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("disabled_at", UTCDateTime),
    _created(),
)

memberships = sa.Table(
    "memberships",
    metadata,
    _workspace_fk(),
    sa.Column("user_id", sa.Uuid, sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
    sa.Column("role", sa.String(16), nullable=False),
    _created(),
    # May decide approvals whatever the role (migration 0013); owners and admins always may.
    sa.Column("approver", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.PrimaryKeyConstraint("workspace_id", "user_id"),
    sa.CheckConstraint("role IN ('owner', 'admin', 'member', 'viewer')", name="role"),
)

sessions = sa.Table(
    "sessions",
    metadata,
    sa.Column("digest", sa.LargeBinary(32), primary_key=True),
    sa.Column("user_id", sa.Uuid, sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
    sa.Column("workspace_id", sa.Uuid, sa.ForeignKey("workspaces.id", ondelete="CASCADE")),
    _created(),
    sa.Column("expires_at", UTCDateTime, nullable=False),
    sa.Index("ix_sessions_user_id", "user_id"),
    sa.Index("ix_sessions_expires_at", "expires_at"),
)

agents = sa.Table(
    "agents",
    metadata,
    _id(),
    _workspace_fk(),
    sa.Column("name", sa.String(100), nullable=False),
    sa.Column("title", sa.String(200), nullable=False, server_default=""),
    sa.Column("adapter", sa.String(16), nullable=False),
    sa.Column("config", JSONType, nullable=False),
    sa.Column("status", sa.String(16), nullable=False, server_default=AgentStatus.ACTIVE.value),
    sa.Column("max_concurrent_runs", sa.Integer, nullable=False, server_default="10"),
    _created(),
    # The org chart (migration 0006): whom the agent reports to (same workspace, no cycles;
    # checked by the service), and its standing instructions.
    sa.Column("reports_to", sa.Uuid, sa.ForeignKey("agents.id", ondelete="SET NULL")),
    sa.Column("description", sa.Text, nullable=False, server_default=""),
    # Approvals (migration 0013): each new task waits for a decision before it is queued; an
    # undecided one expires after `approval_ttl_s` (None: the setting) with `approval_default`.
    sa.Column("requires_approval", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("approval_ttl_s", sa.Integer),
    sa.Column("approval_default", sa.String(8)),
    # Breakers (migration 0014): overrides of the instance's limits (a key left out uses the
    # default, a null one is no limit), why a breaker paused the agent, where its windows
    # start (the last resume) and its failed runs in a row.
    sa.Column("breakers", JSONType),
    sa.Column("paused_reason", sa.Text),
    sa.Column("breaker_since", UTCDateTime),
    sa.Column("failures_in_a_row", sa.Integer, nullable=False, server_default="0"),
    sa.UniqueConstraint("workspace_id", "name", name="uq_agents_workspace_name"),
    sa.CheckConstraint(
        "status IN ({})".format(", ".join(f"'{s.value}'" for s in AgentStatus)), name="status"
    ),
    sa.Index("ix_agents_reports_to", "reports_to"),
)

api_keys = sa.Table(
    "api_keys",
    metadata,
    _id(),
    _workspace_fk(),
    sa.Column("user_id", sa.Uuid, sa.ForeignKey("users.id", ondelete="CASCADE")),
    sa.Column("agent_id", sa.Uuid, sa.ForeignKey("agents.id", ondelete="CASCADE")),
    sa.Column("name", sa.String(100), nullable=False),
    sa.Column("prefix", sa.String(16), nullable=False),
    sa.Column("digest", sa.LargeBinary(32), nullable=False, unique=True),
    sa.Column("scopes", JSONType, nullable=False),
    sa.Column("expires_at", UTCDateTime),
    sa.Column("last_used_at", UTCDateTime),
    sa.Column("revoked_at", UTCDateTime),
    _created(),
    # Relay rate limits (migration 0014): requests and tokens per minute; null is no limit.
    sa.Column("rpm_limit", sa.Integer),
    sa.Column("tpm_limit", sa.Integer),
    sa.CheckConstraint("(user_id IS NOT NULL) OR (agent_id IS NOT NULL)", name="owner"),
)

tasks = sa.Table(
    "tasks",
    metadata,
    _id(),
    _workspace_fk(),
    sa.Column("number", sa.BigInteger, nullable=False),
    sa.Column("title", sa.String(200), nullable=False),
    sa.Column("prompt", sa.Text, nullable=False),
    sa.Column("agent_id", sa.Uuid, sa.ForeignKey("agents.id"), nullable=False),
    sa.Column("creator_user_id", sa.Uuid, sa.ForeignKey("users.id", ondelete="SET NULL")),
    sa.Column("creator_key_id", sa.Uuid, sa.ForeignKey("api_keys.id", ondelete="SET NULL")),
    sa.Column("status", sa.String(24), nullable=False),
    sa.Column("priority", sa.Integer, nullable=False, server_default="0"),
    sa.Column("labels", JSONType, nullable=False, server_default="[]"),
    sa.Column("result", sa.Text),
    sa.Column("error", sa.Text),
    _created(),
    sa.Column("updated_at", UTCDateTime, nullable=False),
    # Task trees (migration 0006): the parent, and for a subtask an agent delegated, the tool
    # step that created it (`<step>.<call>`), so a retried step never creates it twice.
    sa.Column("parent_id", sa.Uuid, sa.ForeignKey("tasks.id", ondelete="CASCADE")),
    sa.Column("origin_key", sa.String(64)),
    # Whether the parent waits for this task (a fire-and-forget delegation does not).
    sa.Column("blocks_parent", sa.Boolean, nullable=False, server_default=sa.true()),
    # Counters that let a run's end skip the tree queries for the tasks that have no tree:
    # children the task waits for plus its blockers, ever attached; tasks it blocks; completed
    # tool steps of its `llm` agent.
    sa.Column("dependencies", sa.Integer, nullable=False, server_default="0"),
    sa.Column("dependents", sa.Integer, nullable=False, server_default="0"),
    sa.Column("steps", sa.Integer, nullable=False, server_default="0"),
    # What an approver's one-off budget override still lets the task's runs spend past their
    # budgets (migration 0017; NULL: none).
    sa.Column("budget_override_usd", sa.Float),
    # Seconds the task's deliveries have run, over every delivery and wake: what its `llm`
    # agent's `max_wall_s` counts (migration 0017).
    sa.Column("elapsed_s", sa.Float, nullable=False, server_default="0"),
    sa.UniqueConstraint("workspace_id", "number", name="uq_tasks_workspace_number"),
    sa.UniqueConstraint("parent_id", "origin_key", name="uq_tasks_parent_origin"),
    sa.Index("ix_tasks_parent", "parent_id"),
    sa.Index("ix_tasks_workspace_created", "workspace_id", "created_at", "id"),
    sa.Index("ix_tasks_workspace_status_created", "workspace_id", "status", "created_at", "id"),
    sa.Index("ix_tasks_created", "created_at"),  # retention (migration 0010)
    # The dashboard's list filtered by agent, and its subtasks of a parent (migration 0016).
    sa.Index("ix_tasks_workspace_agent_created", "workspace_id", "agent_id", "created_at", "id"),
    sa.Index("ix_tasks_parent_created", "parent_id", "created_at", "id"),
)

task_comments = sa.Table(
    "task_comments",
    metadata,
    _id(),
    _workspace_fk(),
    sa.Column("task_id", sa.Uuid, sa.ForeignKey("tasks.id", ondelete="CASCADE"), nullable=False),
    sa.Column("author_type", sa.String(16), nullable=False),
    sa.Column("author_id", sa.Uuid),
    sa.Column("body", sa.Text, nullable=False),
    _created(),
    sa.Column("origin_key", sa.String(64)),  # an agent's tool step (see tasks.origin_key)
    sa.Index("ix_task_comments_task_created", "task_id", "created_at", "id"),
    sa.UniqueConstraint("task_id", "origin_key", name="uq_task_comments_task_origin"),
)

# A task waits (`blocked`) until each of its blockers has ended (migration 0006).
task_blockers = sa.Table(
    "task_blockers",
    metadata,
    sa.Column("task_id", sa.Uuid, sa.ForeignKey("tasks.id", ondelete="CASCADE"), nullable=False),
    sa.Column("blocker_id", sa.Uuid, sa.ForeignKey("tasks.id", ondelete="CASCADE"), nullable=False),
    sa.Column("workspace_id", sa.Uuid, nullable=False),
    _created(),
    sa.PrimaryKeyConstraint("task_id", "blocker_id"),
    sa.Index("ix_task_blockers_blocker", "blocker_id"),
)

# The completed steps of an `llm` agent's tool loop on a task: the conversation the next
# delivery (after a crash, or when the task wakes) resumes from (migration 0006).
task_steps = sa.Table(
    "task_steps",
    metadata,
    sa.Column("task_id", sa.Uuid, sa.ForeignKey("tasks.id", ondelete="CASCADE"), nullable=False),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("run_id", sa.Uuid, sa.ForeignKey("runs.id", ondelete="SET NULL")),
    sa.Column("messages", JSONType, nullable=False),
    sa.Column("cost_usd", sa.Float, nullable=False, server_default="0"),
    _created(),
    sa.PrimaryKeyConstraint("task_id", "step"),
)

# A tool step whose calls reach outside Bullpen (MCP tools; migration 0018), from the moment
# the model made it until it commits: its messages and calls, and each outside call's state
# (`started`, then `done` with its result), so a delivery after a crash carries the same step
# out and never makes a started call again. The step's commit deletes the row.
task_open_steps = sa.Table(
    "task_open_steps",
    metadata,
    sa.Column("task_id", sa.Uuid, sa.ForeignKey("tasks.id", ondelete="CASCADE"), nullable=False),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("run_id", sa.Uuid),
    sa.Column("messages", JSONType, nullable=False),
    sa.Column("calls", JSONType, nullable=False),
    sa.Column("results", JSONType, nullable=False),
    sa.Column("cost_usd", sa.Float, nullable=False, server_default="0"),
    _created(),
    sa.PrimaryKeyConstraint("task_id", "step"),
)

runs = sa.Table(
    "runs",
    metadata,
    _id(),
    _workspace_fk(),
    sa.Column("task_id", sa.Uuid, sa.ForeignKey("tasks.id", ondelete="CASCADE"), nullable=False),
    sa.Column("agent_id", sa.Uuid, sa.ForeignKey("agents.id"), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False, server_default="0"),
    sa.Column("lease_owner", sa.String(64)),
    sa.Column("lease_expires_at", UTCDateTime),
    sa.Column("queued_at", UTCDateTime, nullable=False),
    sa.Column("started_at", UTCDateTime),
    sa.Column("first_token_at", UTCDateTime),
    sa.Column("finished_at", UTCDateTime),
    sa.Column("ttft_ms", sa.Float),
    sa.Column("provider", sa.String(100)),
    sa.Column("model", sa.String(200)),
    sa.Column("input_tokens", sa.Integer),
    sa.Column("output_tokens", sa.Integer),
    sa.Column("error", sa.Text),
    # The queue (migration 0003): claimed by priority, fairly across workspaces, not before
    # available_at (a retry's backoff); failures counts deliveries that ended without an outcome.
    sa.Column("priority", sa.Integer, nullable=False, server_default="0"),
    sa.Column("available_at", UTCDateTime),
    sa.Column("failures", sa.Integer, nullable=False, server_default="0"),
    # Those of the failures whose worker died holding the run (migration 0022): claims keep
    # such runs apart, so a poison run does not take the same good runs down again and again.
    sa.Column("lost_leases", sa.Integer, nullable=False, server_default="0"),
    sa.Column("cancel_requested_at", UTCDateTime),
    # The gateway's record: a typed error, the cost, and every provider attempt of the call.
    sa.Column("error_code", sa.String(64)),
    sa.Column("cost_usd", sa.Float),
    sa.Column("llm_calls", JSONType),
    # The W3C traceparent of what enqueued the run (migration 0019; only with tracing on):
    # its worker's spans continue that trace.
    sa.Column("trace_parent", sa.String(55)),
    sa.Index("ix_runs_task_id", "task_id"),
    sa.Index("ix_runs_status_queued", "status", "queued_at"),
    # Each workspace's queue head in claim order: a range scan, whatever the queue's length.
    sa.Index(
        "ix_runs_queue_head", "status", "workspace_id", sa.desc("priority"), "queued_at", "id"
    ),
    sa.Index("ix_runs_status_lease", "status", "lease_expires_at"),
    # The run-rate breaker (migration 0014): an agent's runs started in the last hour.
    sa.Index("ix_runs_agent_started", "agent_id", "started_at"),
    # The dashboard's per-agent figures of today (migration 0016).
    sa.Index("ix_runs_workspace_started", "workspace_id", "started_at"),
    # Checkout (migration 0006): at most one queued or running run per task.
    sa.Index(
        "uq_runs_task_active",
        "task_id",
        unique=True,
        sqlite_where=sa.text("status IN ('queued', 'running')"),
    ),
)

run_events = sa.Table(
    "run_events",
    metadata,
    sa.Column("run_id", sa.Uuid, sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("workspace_id", sa.Uuid, nullable=False),
    sa.Column("task_id", sa.Uuid, nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("data", JSONType, nullable=False),
    _created(),
    sa.PrimaryKeyConstraint("run_id", "seq"),
    sa.Index("ix_run_events_created", "created_at"),
)

# Every task's creation and status change, written by triggers on `tasks` (migration 0008) in
# the changing transaction, and the workspace's notices (migration 0013: `kind` set, the task
# columns empty; bullpen/store/notices.py); the workspace stream reads it in (xid, id) order.
task_changes = sa.Table(
    "task_changes",
    metadata,
    sa.Column(
        "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), sa.Identity(), primary_key=True
    ),
    # PostgreSQL: the writing transaction's id (see bullpen/store/changes.py); SQLite: 0.
    sa.Column("xid", sa.BigInteger, nullable=False),
    # No foreign key: its check would lock the workspace row (KEY SHARE) in every claim and
    # finish, and that row is hot. Deleting a workspace deletes its changes explicitly.
    sa.Column("workspace_id", sa.Uuid, nullable=False),
    sa.Column("task_id", sa.Uuid),  # the task columns are None for a notice
    sa.Column("parent_id", sa.Uuid),
    sa.Column("agent_id", sa.Uuid),
    sa.Column("number", sa.BigInteger),
    sa.Column("status", sa.String(24)),
    sa.Column("previous", sa.String(24)),  # None for a creation
    sa.Column("title", sa.String(200)),  # only for a creation
    sa.Column("at", UTCDateTime, nullable=False),
    sa.Column("kind", sa.String(40)),  # a notice's kind (None for a task change)
    sa.Column("data", JSONType),  # a notice's data
    sa.Index("ix_task_changes_feed", "workspace_id", "xid", "id"),
    sa.Index("ix_task_changes_task", "task_id"),
    sa.Index("ix_task_changes_at", "at"),
    sqlite_autoincrement=True,
)

# Human-in-the-loop gates (migration 0013): a task held before it is queued (`task`), a tool
# step held before it runs (`tool_call`: the step's messages in `subject`), a budget override.
approvals = sa.Table(
    "approvals",
    metadata,
    _id(),
    _workspace_fk(),
    sa.Column("kind", sa.String(24), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("task_id", sa.Uuid, sa.ForeignKey("tasks.id", ondelete="CASCADE"), nullable=False),
    sa.Column("agent_id", sa.Uuid, sa.ForeignKey("agents.id"), nullable=False),
    sa.Column("run_id", sa.Uuid),  # the run that asked (a tool call's)
    sa.Column("step", sa.Integer),  # the tool step held (a tool call's)
    sa.Column("subject", JSONType, nullable=False),
    sa.Column("default_outcome", sa.String(8), nullable=False),
    sa.Column("expires_at", UTCDateTime),  # None: created_at + BULLPEN_APPROVAL_TTL_S
    sa.Column("reason", sa.Text),
    sa.Column("decided_at", UTCDateTime),
    sa.Column("decided_by_user_id", sa.Uuid, sa.ForeignKey("users.id", ondelete="SET NULL")),
    sa.Column("decided_by_key_id", sa.Uuid, sa.ForeignKey("api_keys.id", ondelete="SET NULL")),
    _created(),
    sa.CheckConstraint("kind IN ('task', 'tool_call', 'budget_override')", name="kind"),
    sa.CheckConstraint("status IN ('pending', 'approved', 'denied', 'expired')", name="status"),
    sa.CheckConstraint("default_outcome IN ('approve', 'deny')", name="default_outcome"),
    sa.Index("ix_approvals_workspace_created", "workspace_id", "created_at", "id"),
    sa.Index("ix_approvals_workspace_status_created", "workspace_id", "status", "created_at", "id"),
    sa.Index("ix_approvals_status_created", "status", "created_at"),
    sa.Index("ix_approvals_task", "task_id"),
    sa.Index(
        "uq_approvals_task_pending",
        "task_id",
        unique=True,
        sqlite_where=sa.text("status = 'pending'"),
    ),
)

audit_events = sa.Table(
    "audit_events",
    metadata,
    _id(),
    sa.Column("workspace_id", sa.Uuid),
    sa.Column("actor_type", sa.String(16), nullable=False),
    sa.Column("actor_id", sa.Uuid),
    sa.Column("action", sa.String(64), nullable=False),
    sa.Column("target_type", sa.String(32), nullable=False),
    sa.Column("target_id", sa.Uuid),
    sa.Column("data", JSONType, nullable=False),
    _created(),
    sa.Index("ix_audit_events_workspace_created", "workspace_id", "created_at"),
    sa.Index("ix_audit_events_created", "created_at"),  # retention (migration 0010)
)

idempotency_keys = sa.Table(
    "idempotency_keys",
    metadata,
    _workspace_fk(),
    sa.Column("principal", sa.String(64), nullable=False),
    sa.Column("route", sa.String(300), nullable=False),
    sa.Column("key", sa.String(255), nullable=False),
    sa.Column("fingerprint", sa.LargeBinary(32), nullable=False),
    sa.Column("status_code", sa.Integer, nullable=False),
    sa.Column("headers", JSONType, nullable=False),
    sa.Column("body", sa.LargeBinary, nullable=False),
    _created(),
    sa.Column("expires_at", UTCDateTime, nullable=False),
    sa.PrimaryKeyConstraint("workspace_id", "principal", "route", "key"),
    sa.Index("ix_idempotency_keys_expires_at", "expires_at"),
)

providers = sa.Table(
    "providers",
    metadata,
    _id(),
    _workspace_fk(),
    sa.Column("name", sa.String(100), nullable=False),
    sa.Column("base_url", sa.String(2000), nullable=False),
    # AES-GCM ciphertext (see security/secrets.py); the key itself is never stored or shown.
    sa.Column("api_key_ciphertext", sa.LargeBinary),
    sa.Column("api_key_hint", sa.String(32)),
    # [{"name", "input_per_mtok", "cached_input_per_mtok", "output_per_mtok"}], USD per 1M tokens.
    sa.Column("models", JSONType, nullable=False),
    sa.Column("connect_timeout_s", sa.Float, nullable=False),
    sa.Column("ttft_timeout_s", sa.Float, nullable=False),
    sa.Column("idle_timeout_s", sa.Float, nullable=False),
    sa.Column("deadline_s", sa.Float, nullable=False),
    _created(),
    sa.Column("updated_at", UTCDateTime, nullable=False),
    sa.UniqueConstraint("workspace_id", "name", name="uq_providers_workspace_name"),
)

model_routes = sa.Table(
    "model_routes",
    metadata,
    _id(),
    _workspace_fk(),
    sa.Column("name", sa.String(100), nullable=False),
    # [{"provider": name, "model": name}], tried in order.
    sa.Column("chain", JSONType, nullable=False),
    _created(),
    sa.Column("updated_at", UTCDateTime, nullable=False),
    sa.UniqueConstraint("workspace_id", "name", name="uq_model_routes_workspace_name"),
)

cost_events = sa.Table(
    "cost_events",
    metadata,
    _id(),
    _workspace_fk(),
    sa.Column("run_id", sa.Uuid, sa.ForeignKey("runs.id", ondelete="SET NULL")),
    sa.Column("agent_id", sa.Uuid, sa.ForeignKey("agents.id", ondelete="SET NULL")),
    sa.Column("user_id", sa.Uuid, sa.ForeignKey("users.id", ondelete="SET NULL")),
    sa.Column("api_key_id", sa.Uuid, sa.ForeignKey("api_keys.id", ondelete="SET NULL")),
    sa.Column("provider", sa.String(100), nullable=False),
    sa.Column("model", sa.String(200), nullable=False),
    sa.Column("input_tokens", sa.Integer, nullable=False),
    sa.Column("cached_input_tokens", sa.Integer, nullable=False),
    sa.Column("output_tokens", sa.Integer, nullable=False),
    sa.Column("cost_usd", sa.Float, nullable=False),
    _created(),
    # Migration 0015: the task of a run's call (run ceilings sum a task's spend), whether the
    # row is an agent run's call or a relay call, and whether its usage was counted by
    # Bullpen (a stream stopped or cut before the provider's usage chunk) instead of reported.
    sa.Column("task_id", sa.Uuid),
    sa.Column("source", sa.String(8), nullable=False, server_default="relay"),
    sa.Column("estimated", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Index("ix_cost_events_workspace_created", "workspace_id", "created_at"),
    sa.Index("ix_cost_events_created", "created_at"),  # retention (migration 0010)
    sa.Index("ix_cost_events_task_id", "task_id"),
    # The spend breaker (migration 0014): an agent's priced calls in the last hour, covering.
    sa.Index(
        "ix_cost_events_agent_priced",
        "agent_id",
        "created_at",
        "cost_usd",
        sqlite_where=sa.text("cost_usd > 0"),
    ),
    sa.CheckConstraint("source IN ('run', 'relay')", name="source"),
)

# Rollups (migration 0021), kept by the writes of the rows they sum (bullpen/store/rollups.py).
# The ledger per UTC day and every key `/api/v1/costs` groups by: a grouping sums these rows.
# A call without an agent or an API key has the nil UUID there (NULLs would never conflict
# in the upsert's key), so these columns have no foreign key: deleting an agent moves its rows
# to the nil UUID as the ledger's `SET NULL` does.
cost_days = sa.Table(
    "cost_days",
    metadata,
    _workspace_fk(),
    sa.Column("day", sa.Date, nullable=False),
    sa.Column("agent_id", sa.Uuid, nullable=False),
    sa.Column("api_key_id", sa.Uuid, nullable=False),
    sa.Column("provider", sa.String(100), nullable=False),
    sa.Column("model", sa.String(200), nullable=False),
    sa.Column("source", sa.String(8), nullable=False),
    sa.Column("calls", sa.BigInteger, nullable=False),
    sa.Column("input_tokens", sa.BigInteger, nullable=False),
    sa.Column("cached_input_tokens", sa.BigInteger, nullable=False),
    sa.Column("output_tokens", sa.BigInteger, nullable=False),
    sa.Column("cost_usd", sa.Float, nullable=False),
    sa.PrimaryKeyConstraint(
        "workspace_id", "day", "agent_id", "api_key_id", "provider", "model", "source"
    ),
    sqlite_with_rowid=False,  # rows in key order: a range of days is one read, no lookups
)
# Runs' time to first token per UTC hour of their start, as counts in log-spaced buckets.
ttft_hours = sa.Table(
    "ttft_hours",
    metadata,
    _workspace_fk(),
    sa.Column("hour", UTCDateTime, nullable=False),
    sa.Column("bucket", sa.Integer, nullable=False),
    sa.Column("runs", sa.BigInteger, nullable=False),
    sa.PrimaryKeyConstraint("workspace_id", "hour", "bucket"),
    sa.Index("ix_ttft_hours_hour", "hour"),  # retention
    sqlite_with_rowid=False,
)

# Budgets (migration 0015): an amount per period over a scope. `spent_usd` and `reserved_usd`
# are the current period's (from `period_start`): calls reserve before they start and while
# they stream, and settle with their real cost. `warned` / `exceeded`: whether this period's
# warning / stop has been announced.
budgets = sa.Table(
    "budgets",
    metadata,
    _id(),
    _workspace_fk(),
    sa.Column("scope", sa.String(16), nullable=False),
    sa.Column("agent_id", sa.Uuid, sa.ForeignKey("agents.id", ondelete="CASCADE")),
    sa.Column("api_key_id", sa.Uuid, sa.ForeignKey("api_keys.id", ondelete="CASCADE")),
    sa.Column("task_id", sa.Uuid, sa.ForeignKey("tasks.id", ondelete="CASCADE")),
    sa.Column("amount_usd", sa.Float, nullable=False),
    sa.Column("period", sa.String(16), nullable=False),
    sa.Column("timezone", sa.String(64), nullable=False),
    sa.Column("warn_percent", sa.Integer),
    sa.Column("hard_stop", sa.Boolean, nullable=False),
    sa.Column("period_start", UTCDateTime, nullable=False),
    sa.Column("spent_usd", sa.Float, nullable=False, server_default="0"),
    sa.Column("reserved_usd", sa.Float, nullable=False, server_default="0"),
    sa.Column("warned", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("exceeded", sa.Boolean, nullable=False, server_default=sa.false()),
    _created(),
    sa.Column("updated_at", UTCDateTime, nullable=False),
    sa.Index("ix_budgets_workspace_id", "workspace_id"),
    sa.CheckConstraint("scope IN ('workspace', 'agent', 'api_key', 'task')", name="scope"),
    sa.CheckConstraint("period IN ('month', 'lifetime')", name="period"),
)

# Open reservations (migration 0015): what a call in flight holds against `budget_ids`. A run's
# are settled in its final transaction, or by the reaper when its lease is lost. `expires_at`
# and `api_key_id` are for relay calls, which do not reserve yet (issue 22).
budget_reservations = sa.Table(
    "budget_reservations",
    metadata,
    _id(),
    _workspace_fk(),
    sa.Column("budget_ids", JSONType, nullable=False),
    sa.Column("amount_usd", sa.Float, nullable=False),
    sa.Column("run_id", sa.Uuid),
    sa.Column("api_key_id", sa.Uuid),
    sa.Column("expires_at", UTCDateTime, nullable=False),
    _created(),
    sa.Index("ix_budget_reservations_run_id", "run_id"),
    sa.Index("ix_budget_reservations_expires_at", "expires_at"),
)

# Routines (migration 0007): a cron schedule in a time zone that creates a task for an agent.
# `next_fire_at` is the next slot not yet handled (NULL: disabled, or the schedule has ended);
# `last_task_id` is the task of the latest fire, which the `skip` concurrency policy checks.
routines = sa.Table(
    "routines",
    metadata,
    _id(),
    _workspace_fk(),
    sa.Column("name", sa.String(100), nullable=False),
    sa.Column("agent_id", sa.Uuid, sa.ForeignKey("agents.id", ondelete="CASCADE"), nullable=False),
    sa.Column("cron", sa.String(100), nullable=False),
    sa.Column("timezone", sa.String(64), nullable=False),
    sa.Column("title", sa.String(200)),
    sa.Column("prompt", sa.Text, nullable=False),
    sa.Column("priority", sa.Integer, nullable=False, server_default="0"),
    sa.Column("labels", JSONType, nullable=False, server_default="[]"),
    sa.Column("concurrency", sa.String(8), nullable=False),
    sa.Column("catch_up", sa.String(8), nullable=False),
    sa.Column("enabled", sa.Boolean, nullable=False),
    sa.Column("next_fire_at", UTCDateTime),
    sa.Column("last_task_id", sa.Uuid),  # no foreign key: a deleted task has simply ended
    sa.Column("creator_user_id", sa.Uuid, sa.ForeignKey("users.id", ondelete="SET NULL")),
    sa.Column("creator_key_id", sa.Uuid, sa.ForeignKey("api_keys.id", ondelete="SET NULL")),
    _created(),
    sa.Column("updated_at", UTCDateTime, nullable=False),
    sa.UniqueConstraint("workspace_id", "name", name="uq_routines_workspace_name"),
    sa.CheckConstraint("concurrency IN ('skip', 'queue')", name="concurrency"),
    sa.CheckConstraint("catch_up IN ('skip', 'latest', 'all')", name="catch_up"),
    sa.Index("ix_routines_next_fire_at", "next_fire_at"),
    sa.Index("ix_routines_agent_id", "agent_id"),
    sa.Index("ix_routines_workspace_created", "workspace_id", "created_at", "id"),
)

# One row per slot a routine handled: the primary key is what keeps two schedulers from
# firing the same slot twice (the loser's insert conflicts and it creates nothing).
routine_fires = sa.Table(
    "routine_fires",
    metadata,
    sa.Column(
        "routine_id", sa.Uuid, sa.ForeignKey("routines.id", ondelete="CASCADE"), nullable=False
    ),
    sa.Column("slot_at", UTCDateTime, nullable=False),
    sa.Column("workspace_id", sa.Uuid, nullable=False),
    sa.Column("source", sa.String(16), nullable=False),
    sa.Column("outcome", sa.String(16), nullable=False),
    sa.Column("detail", sa.Text),
    sa.Column("task_id", sa.Uuid),
    _created(),
    sa.PrimaryKeyConstraint("routine_id", "slot_at"),
    sa.CheckConstraint("source IN ('schedule', 'manual')", name="source"),
    sa.CheckConstraint(
        "outcome IN ('created', 'skipped_open', 'skipped_agent', 'skipped_backlog', 'missed')",
        name="outcome",
    ),
)

# Invitations (migration 0009, issue 19 finding 10): an admin invites an email; the membership
# exists only once the user with that email accepts. One pending invitation per (workspace,
# email): inviting again renews it. Accepted, declined and revoked invitations are deleted.
invitations = sa.Table(
    "invitations",
    metadata,
    _id(),
    _workspace_fk(),
    sa.Column("email", sa.String(320), nullable=False),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("invited_by_type", sa.String(16), nullable=False),
    sa.Column("invited_by_id", sa.Uuid),
    _created(),
    sa.Column("expires_at", UTCDateTime, nullable=False),
    sa.UniqueConstraint("workspace_id", "email", name="uq_invitations_workspace_email"),
    sa.CheckConstraint("role IN ('owner', 'admin', 'member', 'viewer')", name="role"),
    sa.Index("ix_invitations_email", "email"),
)

# MCP servers a workspace registered (migration 0018): their tools are offered to `llm`
# agents that list them. `http`: a URL and headers, each header value sealed (AES-GCM, bound
# to the server and the header name) with its hint; `stdio`: a command on the operator's
# allow-list and its environment, started like a `process` agent's.
mcp_servers = sa.Table(
    "mcp_servers",
    metadata,
    _id(),
    _workspace_fk(),
    sa.Column("name", sa.String(32), nullable=False),
    sa.Column("transport", sa.String(8), nullable=False),
    sa.Column("url", sa.String(2000)),
    sa.Column("headers", JSONType, nullable=False, server_default="{}"),
    sa.Column("command", JSONType),
    sa.Column("env", JSONType, nullable=False, server_default="{}"),
    sa.Column("timeout_s", sa.Float, nullable=False),
    _created(),
    sa.Column("updated_at", UTCDateTime, nullable=False),
    sa.UniqueConstraint("workspace_id", "name", name="uq_mcp_servers_workspace_name"),
    sa.CheckConstraint("transport IN ('http', 'stdio')", name="transport"),
)
