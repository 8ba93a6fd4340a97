"""the durable run queue: priority, retry time, failures, cancel requests

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03 02:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("priority", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("available_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("failures", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(
            sa.Column("cancel_requested_at", sa.DateTime(timezone=True), nullable=True)
        )
        batch_op.create_index(
            "ix_runs_queue_head",
            ["status", "workspace_id", sa.text("priority DESC"), "queued_at", "id"],
            unique=False,
        )
        batch_op.create_index("ix_runs_status_lease", ["status", "lease_expires_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index("ix_runs_status_lease")
        batch_op.drop_index("ix_runs_queue_head")
        batch_op.drop_column("cancel_requested_at")
        batch_op.drop_column("failures")
        batch_op.drop_column("available_at")
        batch_op.drop_column("priority")
