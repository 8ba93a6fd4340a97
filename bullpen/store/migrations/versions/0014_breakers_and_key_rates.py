"""breakers and key rates: pause runaway agents; relay keys' requests and tokens per minute

Agents get their breaker overrides, the reason a breaker paused them, the start of their
breaker window (set on resume) and their failures in a row. Two indexes keep the checks cheap:
runs by agent and start (runs started in the last hour), and priced ledger rows by agent and
time, covering `cost_usd` (spend in the last hour). API keys get `rpm_limit` and `tpm_limit`.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05 14:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_PRICED = "cost_usd > 0"


def upgrade() -> None:
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.add_column(sa.Column("breakers", JSONType, nullable=True))
        batch_op.add_column(sa.Column("paused_reason", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("breaker_since", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(
            sa.Column("failures_in_a_row", sa.Integer(), server_default="0", nullable=False)
        )
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.add_column(sa.Column("rpm_limit", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("tpm_limit", sa.Integer(), nullable=True))
    op.create_index("ix_runs_agent_started", "runs", ["agent_id", "started_at"])
    op.create_index(
        "ix_cost_events_agent_priced",
        "cost_events",
        ["agent_id", "created_at", "cost_usd"],
        sqlite_where=sa.text(_PRICED),
        postgresql_where=sa.text(_PRICED),
    )


def downgrade() -> None:
    op.drop_index("ix_cost_events_agent_priced", table_name="cost_events")
    op.drop_index("ix_runs_agent_started", table_name="runs")
    # In place (SQLite >= 3.35 drops a column without rebuilding the table): a rebuild drops
    # `agents`, which the foreign keys of tasks and runs refuse while they have rows.
    for column in ("tpm_limit", "rpm_limit"):
        op.drop_column("api_keys", column)
    for column in ("failures_in_a_row", "breaker_since", "paused_reason", "breakers"):
        op.drop_column("agents", column)
