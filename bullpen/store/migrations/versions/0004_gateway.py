"""the gateway: providers with encrypted keys, model routes, the cost ledger, run call records

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03 07:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def _workspace() -> sa.Column[object]:
    return sa.Column(
        "workspace_id",
        sa.Uuid(),
        sa.ForeignKey("workspaces.id", ondelete="CASCADE"),
        nullable=False,
    )


def upgrade() -> None:
    op.create_table(
        "providers",
        sa.Column("id", sa.Uuid(), primary_key=True),
        _workspace(),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("base_url", sa.String(2000), nullable=False),
        sa.Column("api_key_ciphertext", sa.LargeBinary(), nullable=True),
        sa.Column("api_key_hint", sa.String(32), nullable=True),
        sa.Column("models", JSONType, nullable=False),
        sa.Column("connect_timeout_s", sa.Float(), nullable=False),
        sa.Column("ttft_timeout_s", sa.Float(), nullable=False),
        sa.Column("idle_timeout_s", sa.Float(), nullable=False),
        sa.Column("deadline_s", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("workspace_id", "name", name="uq_providers_workspace_name"),
    )
    op.create_table(
        "model_routes",
        sa.Column("id", sa.Uuid(), primary_key=True),
        _workspace(),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("chain", JSONType, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("workspace_id", "name", name="uq_model_routes_workspace_name"),
    )
    op.create_table(
        "cost_events",
        sa.Column("id", sa.Uuid(), primary_key=True),
        _workspace(),
        sa.Column("run_id", sa.Uuid(), sa.ForeignKey("runs.id", ondelete="SET NULL")),
        sa.Column("agent_id", sa.Uuid(), sa.ForeignKey("agents.id", ondelete="SET NULL")),
        sa.Column("user_id", sa.Uuid(), sa.ForeignKey("users.id", ondelete="SET NULL")),
        sa.Column("api_key_id", sa.Uuid(), sa.ForeignKey("api_keys.id", ondelete="SET NULL")),
        sa.Column("provider", sa.String(100), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("input_tokens", sa.Integer(), nullable=False),
        sa.Column("cached_input_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index(
        "ix_cost_events_workspace_created", "cost_events", ["workspace_id", "created_at"]
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("error_code", sa.String(64), nullable=True))
        batch_op.add_column(sa.Column("cost_usd", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("llm_calls", JSONType, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("llm_calls")
        batch_op.drop_column("cost_usd")
        batch_op.drop_column("error_code")
    op.drop_index("ix_cost_events_workspace_created", table_name="cost_events")
    op.drop_table("cost_events")
    op.drop_table("model_routes")
    op.drop_table("providers")
