"""retention: audit events, usage ledger rows and tasks are found by age for the cleanup job

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05 01:30:00
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_INDEXES = (
    ("ix_audit_events_created", "audit_events"),
    ("ix_cost_events_created", "cost_events"),
    ("ix_tasks_created", "tasks"),
)


def upgrade() -> None:
    for name, table in _INDEXES:
        op.create_index(name, table, ["created_at"])


def downgrade() -> None:
    for name, table in _INDEXES:
        op.drop_index(name, table_name=table)
