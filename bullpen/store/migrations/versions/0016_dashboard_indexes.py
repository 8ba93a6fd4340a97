"""dashboard indexes: tasks by agent and by parent in creation order, runs started per workspace

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05 17:15:00
"""

from __future__ import annotations

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_tasks_workspace_agent_created",
        "tasks",
        ["workspace_id", "agent_id", "created_at", "id"],
    )
    op.create_index("ix_tasks_parent_created", "tasks", ["parent_id", "created_at", "id"])
    op.create_index("ix_runs_workspace_started", "runs", ["workspace_id", "started_at"])


def downgrade() -> None:
    op.drop_index("ix_runs_workspace_started", "runs")
    op.drop_index("ix_tasks_parent_created", "tasks")
    op.drop_index("ix_tasks_workspace_agent_created", "tasks")
