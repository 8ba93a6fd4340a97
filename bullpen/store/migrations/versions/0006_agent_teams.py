"""agent teams: the org chart, task trees and blockers, tool steps, one active run per task

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03 13:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_ACTIVE = "status IN ('queued', 'running')"


def upgrade() -> None:
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.add_column(sa.Column("reports_to", sa.Uuid(), nullable=True))
        batch_op.add_column(sa.Column("description", sa.Text(), server_default="", nullable=False))
        batch_op.create_foreign_key(
            "fk_agents_reports_to_agents", "agents", ["reports_to"], ["id"], ondelete="SET NULL"
        )
        batch_op.create_index("ix_agents_reports_to", ["reports_to"], unique=False)
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("parent_id", sa.Uuid(), nullable=True))
        batch_op.add_column(sa.Column("origin_key", sa.String(64), nullable=True))
        batch_op.add_column(
            sa.Column("blocks_parent", sa.Boolean(), server_default=sa.true(), nullable=False)
        )
        for counter in ("dependencies", "dependents", "steps"):
            batch_op.add_column(
                sa.Column(counter, sa.Integer(), server_default="0", nullable=False)
            )
        batch_op.create_foreign_key(
            "fk_tasks_parent_id_tasks", "tasks", ["parent_id"], ["id"], ondelete="CASCADE"
        )
        batch_op.create_unique_constraint("uq_tasks_parent_origin", ["parent_id", "origin_key"])
        batch_op.create_index("ix_tasks_parent", ["parent_id"], unique=False)
    with op.batch_alter_table("task_comments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("origin_key", sa.String(64), nullable=True))
        batch_op.create_unique_constraint("uq_task_comments_task_origin", ["task_id", "origin_key"])
    op.create_table(
        "task_blockers",
        sa.Column(
            "task_id", sa.Uuid(), sa.ForeignKey("tasks.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column(
            "blocker_id", sa.Uuid(), sa.ForeignKey("tasks.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("workspace_id", sa.Uuid(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("task_id", "blocker_id", name="pk_task_blockers"),
    )
    op.create_index("ix_task_blockers_blocker", "task_blockers", ["blocker_id"])
    op.create_table(
        "task_steps",
        sa.Column(
            "task_id", sa.Uuid(), sa.ForeignKey("tasks.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Uuid(), sa.ForeignKey("runs.id", ondelete="SET NULL")),
        sa.Column("messages", JSONType, nullable=False),
        sa.Column("cost_usd", sa.Float(), server_default="0", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("task_id", "step", name="pk_task_steps"),
    )
    op.create_index(
        "uq_runs_task_active",
        "runs",
        ["task_id"],
        unique=True,
        sqlite_where=sa.text(_ACTIVE),
        postgresql_where=sa.text(_ACTIVE),
    )


def downgrade() -> None:
    op.drop_index("uq_runs_task_active", table_name="runs")
    op.drop_table("task_steps")
    op.drop_index("ix_task_blockers_blocker", table_name="task_blockers")
    op.drop_table("task_blockers")
    with op.batch_alter_table("task_comments", schema=None) as batch_op:
        batch_op.drop_constraint("uq_task_comments_task_origin", type_="unique")
        batch_op.drop_column("origin_key")
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_index("ix_tasks_parent")
        batch_op.drop_constraint("uq_tasks_parent_origin", type_="unique")
        batch_op.drop_constraint("fk_tasks_parent_id_tasks", type_="foreignkey")
        for column in ("steps", "dependents", "dependencies", "blocks_parent", "origin_key"):
            batch_op.drop_column(column)
        batch_op.drop_column("parent_id")
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.drop_index("ix_agents_reports_to")
        batch_op.drop_constraint("fk_agents_reports_to_agents", type_="foreignkey")
        batch_op.drop_column("description")
        batch_op.drop_column("reports_to")
