"""budget overrides: what an approver's one-off override still lets a task's runs spend

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05 17:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("budget_override_usd", sa.Float))


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("budget_override_usd")
