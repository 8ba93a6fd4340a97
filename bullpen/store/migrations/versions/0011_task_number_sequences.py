"""task number sequences: on PostgreSQL each workspace's task numbers come from a sequence

A counter on the workspace row, incremented by every create, kept the row locked until the
create committed: a workspace's creates ran one at a time (issue 21). Each existing workspace
gets its sequence, starting after the last number its counter handed out. SQLite keeps the
counter: it has one writer at a time anyway.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def _name(workspace_id: object) -> str:
    # As bullpen.store.tasks.number_sequence; a migration keeps its own copy of what it writes.
    return "bullpen_task_numbers_" + str(workspace_id).replace("-", "")


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    for row in bind.execute(sa.text("SELECT id, task_counter FROM workspaces")):
        start = int(row.task_counter) + 1
        bind.execute(sa.text(f'CREATE SEQUENCE "{_name(row.id)}" AS bigint START {start}'))


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    for row in bind.execute(sa.text("SELECT id FROM workspaces")):
        name = _name(row.id)
        # The counter goes on from the last number the sequence handed out (NULL: none).
        bind.execute(
            sa.text(
                "UPDATE workspaces SET task_counter = GREATEST(task_counter, "
                "pg_sequence_last_value(CAST(:sequence AS regclass))) WHERE id = :id"
            ),
            {"sequence": name, "id": row.id},
        )
        bind.execute(sa.text(f'DROP SEQUENCE "{name}"'))
