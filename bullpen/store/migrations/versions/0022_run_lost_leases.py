"""runs.lost_leases: deliveries that ended with their worker gone (the poison-run quarantine)

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-06 12:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A constant default: a metadata-only change on PostgreSQL, whatever the table's size.
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("lost_leases", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("lost_leases")
