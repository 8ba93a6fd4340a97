"""routines: cron schedules that create tasks for agents, and the slots they fired

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_OUTCOMES = "'created', 'skipped_open', 'skipped_agent', 'skipped_backlog', 'missed'"


def upgrade() -> None:
    op.create_table(
        "routines",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("workspace_id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("agent_id", sa.Uuid(), nullable=False),
        sa.Column("cron", sa.String(100), nullable=False),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("title", sa.String(200), nullable=True),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("priority", sa.Integer(), server_default="0", nullable=False),
        sa.Column("labels", JSONType, server_default="[]", nullable=False),
        sa.Column("concurrency", sa.String(8), nullable=False),
        sa.Column("catch_up", sa.String(8), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("next_fire_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_task_id", sa.Uuid(), nullable=True),
        sa.Column("creator_user_id", sa.Uuid(), nullable=True),
        sa.Column("creator_key_id", sa.Uuid(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("concurrency IN ('skip', 'queue')", name="ck_routines_concurrency"),
        sa.CheckConstraint("catch_up IN ('skip', 'latest', 'all')", name="ck_routines_catch_up"),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name="fk_routines_workspace_id_workspaces",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["agent_id"], ["agents.id"], name="fk_routines_agent_id_agents", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["creator_user_id"],
            ["users.id"],
            name="fk_routines_creator_user_id_users",
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["creator_key_id"],
            ["api_keys.id"],
            name="fk_routines_creator_key_id_api_keys",
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_routines"),
        sa.UniqueConstraint("workspace_id", "name", name="uq_routines_workspace_name"),
    )
    op.create_index("ix_routines_next_fire_at", "routines", ["next_fire_at"])
    op.create_index("ix_routines_agent_id", "routines", ["agent_id"])
    op.create_index(
        "ix_routines_workspace_created", "routines", ["workspace_id", "created_at", "id"]
    )
    op.create_table(
        "routine_fires",
        sa.Column("routine_id", sa.Uuid(), nullable=False),
        sa.Column("slot_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("workspace_id", sa.Uuid(), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("task_id", sa.Uuid(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("source IN ('schedule', 'manual')", name="ck_routine_fires_source"),
        sa.CheckConstraint(f"outcome IN ({_OUTCOMES})", name="ck_routine_fires_outcome"),
        sa.ForeignKeyConstraint(
            ["routine_id"],
            ["routines.id"],
            name="fk_routine_fires_routine_id_routines",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("routine_id", "slot_at", name="pk_routine_fires"),
    )


def downgrade() -> None:
    op.drop_table("routine_fires")
    op.drop_index("ix_routines_workspace_created", table_name="routines")
    op.drop_index("ix_routines_agent_id", table_name="routines")
    op.drop_index("ix_routines_next_fire_at", table_name="routines")
    op.drop_table("routines")
