"""task numbers from the workspace's counter again, on PostgreSQL too

Migration 0011 gave each workspace a sequence so its creates would not wait for one another on
the counter's row. Measured under the reference load they did worse together than one at a
time (issue 21, docs/benchmarks/history.md), so the counter comes back: it goes on from the
last number the sequence handed out, and the sequences are dropped. The downgrade gives each
workspace its sequence again, starting after the counter.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def _name(workspace_id: object) -> str:
    # As migration 0011 named them; a migration keeps its own copy of what it reads.
    return "bullpen_task_numbers_" + str(workspace_id).replace("-", "")


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    for row in bind.execute(sa.text("SELECT id FROM workspaces")):
        name = _name(row.id)
        # NULL (kept counter) for a sequence that never handed out a number, or that is missing
        # (a workspace row written by hand): nothing to go on from, and nothing to drop.
        bind.execute(
            sa.text(
                "UPDATE workspaces SET task_counter = GREATEST(task_counter, "
                "pg_sequence_last_value(to_regclass(:sequence))) WHERE id = :id"
            ),
            {"sequence": name, "id": row.id},
        )
        bind.execute(sa.text(f'DROP SEQUENCE IF EXISTS "{name}"'))


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    for row in bind.execute(sa.text("SELECT id, task_counter FROM workspaces")):
        start = int(row.task_counter) + 1
        bind.execute(sa.text(f'CREATE SEQUENCE "{_name(row.id)}" AS bigint START {start}'))
