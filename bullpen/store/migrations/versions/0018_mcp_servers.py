"""mcp servers: a workspace's MCP servers, and tool steps open while their calls run

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05 17:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "mcp_servers",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("workspace_id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(32), nullable=False),
        sa.Column("transport", sa.String(8), nullable=False),
        sa.Column("url", sa.String(2000), nullable=True),
        sa.Column("headers", _JSON, nullable=False, server_default="{}"),
        sa.Column("command", _JSON, nullable=True),
        sa.Column("env", _JSON, nullable=False, server_default="{}"),
        sa.Column("timeout_s", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name="fk_mcp_servers_workspace_id_workspaces",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_mcp_servers"),
        sa.UniqueConstraint("workspace_id", "name", name="uq_mcp_servers_workspace_name"),
        sa.CheckConstraint("transport IN ('http', 'stdio')", name="ck_mcp_servers_transport"),
    )
    op.create_table(
        "task_open_steps",
        sa.Column("task_id", sa.Uuid(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Uuid(), nullable=True),
        sa.Column("messages", _JSON, nullable=False),
        sa.Column("calls", _JSON, nullable=False),
        sa.Column("results", _JSON, nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=False, server_default="0"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["task_id"],
            ["tasks.id"],
            name="fk_task_open_steps_task_id_tasks",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("task_id", "step", name="pk_task_open_steps"),
    )


def downgrade() -> None:
    op.drop_table("task_open_steps")
    op.drop_table("mcp_servers")
