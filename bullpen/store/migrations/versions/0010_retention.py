"""retention: audit events, usage ledger rows and tasks are found by age for the cleanup job

Revision ID: 0010
Revises: 0008 (0009 once merged with the invitations migration, written at the same time)
Create Date: 2026-12-05 01:30:00
"""

from __future__ import annotations

from alembic import op

revision = "0010"
# Issue 19's branches each added a migration after 0008; when 0009 (invitations) is present,
# this one follows it: set "0009" here at the merge, so there is one head.
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
