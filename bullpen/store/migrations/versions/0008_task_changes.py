"""task changes: a log of every task's status changes, written by triggers, for the workspace stream

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

# PostgreSQL: `xid` is the writing transaction's id. Readers take only rows whose transaction
# ended before every transaction still running (see bullpen.store.changes), in (xid, id)
# order: nothing can commit into the part they have read, whatever the commit order.
_PG_FUNCTION = """
CREATE FUNCTION bullpen_task_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO task_changes
            (xid, workspace_id, task_id, parent_id, agent_id, number, status, previous, title,
            at) VALUES (
            pg_current_xact_id()::text::bigint, NEW.workspace_id, NEW.id, NEW.parent_id,
            NEW.agent_id, NEW.number, NEW.status, NULL, NEW.title, NEW.updated_at);
    ELSE
        INSERT INTO task_changes
            (xid, workspace_id, task_id, parent_id, agent_id, number, status, previous, title,
            at) VALUES (
            pg_current_xact_id()::text::bigint, NEW.workspace_id, NEW.id, NEW.parent_id,
            NEW.agent_id, NEW.number, NEW.status, OLD.status, NULL, NEW.updated_at);
    END IF;
    RETURN NULL;
END
$$
"""
_PG_TRIGGERS = (
    "CREATE TRIGGER tr_tasks_created AFTER INSERT ON tasks "
    "FOR EACH ROW EXECUTE FUNCTION bullpen_task_change()",
    "CREATE TRIGGER tr_tasks_status AFTER UPDATE OF status ON tasks "
    "FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) "
    "EXECUTE FUNCTION bullpen_task_change()",
)
# SQLite: one writer at a time, so id order is commit order; `xid` is always 0.
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


def upgrade() -> None:
    op.create_table(
        "task_changes",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            sa.Identity(),
            nullable=False,
        ),
        sa.Column("xid", sa.BigInteger(), nullable=False),
        sa.Column("workspace_id", sa.Uuid(), nullable=False),
        sa.Column("task_id", sa.Uuid(), nullable=False),
        sa.Column("parent_id", sa.Uuid(), nullable=True),
        sa.Column("agent_id", sa.Uuid(), nullable=False),
        sa.Column("number", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(24), nullable=False),
        sa.Column("previous", sa.String(24), nullable=True),
        sa.Column("title", sa.String(200), nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_task_changes_feed", "task_changes", ["workspace_id", "xid", "id"])
    op.create_index("ix_task_changes_task", "task_changes", ["task_id"])
    op.create_index("ix_task_changes_at", "task_changes", ["at"])
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_PG_FUNCTION)
        for statement in _PG_TRIGGERS:
            op.execute(statement)
    else:
        for statement in _SQLITE_TRIGGERS:
            op.execute(statement)


def downgrade() -> None:
    pg = op.get_bind().dialect.name == "postgresql"
    for name in ("tr_tasks_status", "tr_tasks_created"):
        op.execute(f"DROP TRIGGER IF EXISTS {name}" + (" ON tasks" if pg else ""))
    if pg:
        op.execute("DROP FUNCTION IF EXISTS bullpen_task_change()")
    op.drop_table("task_changes")
