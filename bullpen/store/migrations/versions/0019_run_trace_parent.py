"""runs.trace_parent: the trace context a run's worker continues (OpenTelemetry traces)

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05 17:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable, no default: a metadata-only change on PostgreSQL, whatever the table's size.
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("trace_parent", sa.String(55), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("trace_parent")
