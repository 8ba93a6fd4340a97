"""rollups: the cost ledger per UTC day and group key, runs' time to first token per hour

`cost_days`: calls, tokens and USD of `cost_events` per workspace, UTC day, agent, API key,
provider, model and source (the nil UUID for a call without an agent or API key).
`ttft_hours`: per workspace and UTC hour of a run's start, how many runs' `ttft_ms` fell in each
log-spaced bucket (bucket 0: below 1 ms; bucket i >= 1: [1.05^(i-1), 1.05^i) ms).
Both are filled here from the existing rows; bullpen/store/rollups.py keeps them from then on.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06 23:30:00
"""

from __future__ import annotations

import math
from uuid import UUID

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

_GROWTH = 1.05
_NO_ID = UUID(int=0)

_PG_COST_DAYS = """
INSERT INTO cost_days (workspace_id, day, agent_id, api_key_id, provider, model, source, calls,
    input_tokens, cached_input_tokens, output_tokens, cost_usd)
SELECT workspace_id, {day}, coalesce(agent_id, :no_id), coalesce(api_key_id, :no_id), provider,
    model, source, count(*), sum(input_tokens), sum(cached_input_tokens), sum(output_tokens),
    sum(cost_usd)
FROM cost_events
GROUP BY 1, 2, 3, 4, 5, 6, 7
"""
_PG_TTFT_HOURS = """
INSERT INTO ttft_hours (workspace_id, hour, bucket, runs)
SELECT workspace_id, timezone('UTC', date_trunc('hour', timezone('UTC', started_at))),
    CASE WHEN ttft_ms >= 1 THEN 1 + floor(ln(ttft_ms) / ln(1.05)) ELSE 0 END, count(*)
FROM runs
WHERE ttft_ms IS NOT NULL AND started_at IS NOT NULL
GROUP BY 1, 2, 3
"""


def _bucket(ttft_ms: float) -> int:
    return 1 + math.floor(math.log(ttft_ms) / math.log(_GROWTH)) if ttft_ms >= 1.0 else 0


def upgrade() -> None:
    op.create_table(
        "cost_days",
        sa.Column("workspace_id", sa.Uuid(), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("agent_id", sa.Uuid(), nullable=False),
        sa.Column("api_key_id", sa.Uuid(), nullable=False),
        sa.Column("provider", sa.String(100), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("source", sa.String(8), nullable=False),
        sa.Column("calls", sa.BigInteger(), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cached_input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name="fk_cost_days_workspace_id_workspaces",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "workspace_id",
            "day",
            "agent_id",
            "api_key_id",
            "provider",
            "model",
            "source",
            name="pk_cost_days",
        ),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "ttft_hours",
        sa.Column("workspace_id", sa.Uuid(), nullable=False),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("bucket", sa.Integer(), nullable=False),
        sa.Column("runs", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name="fk_ttft_hours_workspace_id_workspaces",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("workspace_id", "hour", "bucket", name="pk_ttft_hours"),
        sqlite_with_rowid=False,
    )
    op.create_index("ix_ttft_hours_hour", "ttft_hours", ["hour"])
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        day = "CAST(timezone('UTC', created_at) AS date)"
        bind.execute(
            sa.text(_PG_COST_DAYS.format(day=day)).bindparams(
                sa.bindparam("no_id", _NO_ID, type_=sa.Uuid())
            )
        )
        bind.execute(sa.text(_PG_TTFT_HOURS))
        return
    # SQLite stores a timestamp as 'YYYY-MM-DD HH:MM:SS.ffffff' (UTC), a date as 'YYYY-MM-DD'.
    bind.execute(
        sa.text(_PG_COST_DAYS.format(day="date(created_at)")).bindparams(
            sa.bindparam("no_id", _NO_ID, type_=sa.Uuid())
        )
    )
    # No logarithm in every SQLite build: the buckets are counted here.
    runs = sa.table(
        "runs",
        sa.column("workspace_id", sa.Uuid()),
        sa.column("started_at", sa.DateTime()),
        sa.column("ttft_ms", sa.Float()),
    )
    counts: dict[tuple[UUID, object, int], int] = {}
    found = bind.execute(
        sa.select(runs.c.workspace_id, runs.c.started_at, runs.c.ttft_ms).where(
            runs.c.ttft_ms.is_not(None), runs.c.started_at.is_not(None)
        )
    )
    for workspace_id, started_at, ttft_ms in found:
        hour = started_at.replace(minute=0, second=0, microsecond=0)  # naive UTC
        key = (workspace_id, hour, _bucket(float(ttft_ms)))
        counts[key] = counts.get(key, 0) + 1
    if counts:
        hours = sa.table(
            "ttft_hours",
            sa.column("workspace_id", sa.Uuid()),
            sa.column("hour", sa.DateTime()),
            sa.column("bucket", sa.Integer()),
            sa.column("runs", sa.BigInteger()),
        )
        bind.execute(
            hours.insert(),
            [
                {"workspace_id": ws, "hour": hour, "bucket": bucket, "runs": n}
                for (ws, hour, bucket), n in counts.items()
            ],
        )


def downgrade() -> None:
    op.drop_index("ix_ttft_hours_hour", table_name="ttft_hours")
    op.drop_table("ttft_hours")
    op.drop_table("cost_days")
