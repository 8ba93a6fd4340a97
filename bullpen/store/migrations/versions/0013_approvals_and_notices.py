"""approvals and workspace notices: human-in-the-loop gates, and notices on the workspace stream

The change log (`task_changes`, migration 0008) also holds the workspace's notices (approvals,
budgets, paused agents): a row with a `kind` and a JSON `data`, the task columns empty, so the
stream keeps one order and one cursor. `approvals` holds the gates: a task held before it is
queued, a tool call held before it runs (and later a budget override). Members may be marked
approvers; an agent may require approval of its tasks, with its own expiry and default outcome.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05 14:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
_TASK_COLUMNS = (
    ("task_id", sa.Uuid()),
    ("agent_id", sa.Uuid()),
    ("number", sa.BigInteger()),
    ("status", sa.String(24)),
)
# SQLite rebuilds `task_changes` to relax its NOT NULLs; a table rename fails while triggers
# name a missing table, so the triggers on `tasks` (as migration 0008 made them) are dropped
# first and made again after.
_SQLITE_TRIGGERS = (
    """CREATE TRIGGER tr_tasks_created AFTER INSERT ON tasks BEGIN
        INSERT INTO task_changes
            (xid, workspace_id, task_id, parent_id, agent_id, number, status, previous, title,
            at) VALUES (0, NEW.workspace_id, NEW.id,
            NEW.parent_id, NEW.agent_id, NEW.number, NEW.status, NULL, NEW.title,
            NEW.updated_at);
    END""",
    """CREATE TRIGGER tr_tasks_status AFTER UPDATE OF status ON tasks
    WHEN OLD.status IS NOT NEW.status BEGIN
        INSERT INTO task_changes
            (xid, workspace_id, task_id, parent_id, agent_id, number, status, previous, title,
            at) VALUES (0, NEW.workspace_id, NEW.id,
            NEW.parent_id, NEW.agent_id, NEW.number, NEW.status, OLD.status, NULL,
            NEW.updated_at);
    END""",
)


def _change_log(*, nullable: bool) -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    if sqlite:
        for name in ("tr_tasks_status", "tr_tasks_created"):
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
    with op.batch_alter_table("task_changes", table_kwargs={"sqlite_autoincrement": True}) as batch:
        if nullable:
            batch.add_column(sa.Column("kind", sa.String(40), nullable=True))
            batch.add_column(sa.Column("data", _JSON, nullable=True))
        else:
            batch.drop_column("data")
            batch.drop_column("kind")
        for name, type_ in _TASK_COLUMNS:
            batch.alter_column(name, existing_type=type_, nullable=nullable)
    if sqlite:
        for statement in _SQLITE_TRIGGERS:
            op.execute(statement)


def upgrade() -> None:
    _change_log(nullable=True)
    # Plain ALTER TABLE on both backends: a batch rebuild of `agents` would drop a table that
    # tasks and runs reference.
    op.add_column(
        "memberships",
        sa.Column("approver", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    op.add_column(
        "agents",
        sa.Column("requires_approval", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    op.add_column("agents", sa.Column("approval_ttl_s", sa.Integer(), nullable=True))
    op.add_column("agents", sa.Column("approval_default", sa.String(8), nullable=True))
    op.create_table(
        "approvals",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("workspace_id", sa.Uuid(), nullable=False),
        sa.Column("kind", sa.String(24), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("task_id", sa.Uuid(), nullable=False),
        sa.Column("agent_id", sa.Uuid(), nullable=False),
        sa.Column("run_id", sa.Uuid(), nullable=True),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column(
            "subject",
            _JSON,
            nullable=False,
        ),
        sa.Column("default_outcome", sa.String(8), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("decided_by_user_id", sa.Uuid(), nullable=True),
        sa.Column("decided_by_key_id", sa.Uuid(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "kind IN ('task', 'tool_call', 'budget_override')", name="ck_approvals_kind"
        ),
        sa.CheckConstraint(
            "status IN ('pending', 'approved', 'denied', 'expired')", name="ck_approvals_status"
        ),
        sa.CheckConstraint(
            "default_outcome IN ('approve', 'deny')", name="ck_approvals_default_outcome"
        ),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name="fk_approvals_workspace_id_workspaces",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["task_id"], ["tasks.id"], name="fk_approvals_task_id_tasks", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(["agent_id"], ["agents.id"], name="fk_approvals_agent_id_agents"),
        sa.ForeignKeyConstraint(
            ["decided_by_user_id"],
            ["users.id"],
            name="fk_approvals_decided_by_user_id_users",
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["decided_by_key_id"],
            ["api_keys.id"],
            name="fk_approvals_decided_by_key_id_api_keys",
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_approvals"),
    )
    op.create_index(
        "ix_approvals_workspace_created", "approvals", ["workspace_id", "created_at", "id"]
    )
    op.create_index(
        "ix_approvals_workspace_status_created",
        "approvals",
        ["workspace_id", "status", "created_at", "id"],
    )
    op.create_index("ix_approvals_status_created", "approvals", ["status", "created_at"])
    op.create_index("ix_approvals_task", "approvals", ["task_id"])
    op.create_index(
        "uq_approvals_task_pending",
        "approvals",
        ["task_id"],
        unique=True,
        sqlite_where=sa.text("status = 'pending'"),
        postgresql_where=sa.text("status = 'pending'"),
    )


def downgrade() -> None:
    op.drop_table("approvals")
    for column in ("approval_default", "approval_ttl_s", "requires_approval"):
        op.drop_column("agents", column)  # SQLite >= 3.35 drops a column in place
    op.drop_column("memberships", "approver")
    op.execute("DELETE FROM task_changes WHERE kind IS NOT NULL")
    _change_log(nullable=False)
