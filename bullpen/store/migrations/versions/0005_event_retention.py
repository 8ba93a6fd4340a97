"""event retention: run events are found by age for the cleanup job

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03 09:30:00
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_run_events_created", "run_events", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_run_events_created", table_name="run_events")
