"""budgets: amounts per period over a scope, reservations of calls in flight, a richer ledger

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05 15:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("cost_events") as batch:
        batch.add_column(sa.Column("task_id", sa.Uuid(), nullable=True))
        batch.add_column(sa.Column("source", sa.String(8), nullable=False, server_default="relay"))
        batch.add_column(
            sa.Column("estimated", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.create_check_constraint("ck_cost_events_source", "source IN ('run', 'relay')")
    # Rows written by a run's final transaction until now carry a run id.
    op.execute("UPDATE cost_events SET source = 'run' WHERE run_id IS NOT NULL")
    op.execute(
        "UPDATE cost_events SET task_id = "
        "(SELECT runs.task_id FROM runs WHERE runs.id = cost_events.run_id) "
        "WHERE run_id IS NOT NULL"
    )
    op.create_index("ix_cost_events_task_id", "cost_events", ["task_id"])
    op.create_table(
        "budgets",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("workspace_id", sa.Uuid(), nullable=False),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("agent_id", sa.Uuid(), nullable=True),
        sa.Column("api_key_id", sa.Uuid(), nullable=True),
        sa.Column("task_id", sa.Uuid(), nullable=True),
        sa.Column("amount_usd", sa.Float(), nullable=False),
        sa.Column("period", sa.String(16), nullable=False),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("warn_percent", sa.Integer(), nullable=True),
        sa.Column("hard_stop", sa.Boolean(), nullable=False),
        sa.Column("period_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("spent_usd", sa.Float(), nullable=False, server_default="0"),
        sa.Column("reserved_usd", sa.Float(), nullable=False, server_default="0"),
        sa.Column("warned", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("exceeded", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "scope IN ('workspace', 'agent', 'api_key', 'task')", name="ck_budgets_scope"
        ),
        sa.CheckConstraint("period IN ('month', 'lifetime')", name="ck_budgets_period"),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name="fk_budgets_workspace_id_workspaces",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["agent_id"], ["agents.id"], name="fk_budgets_agent_id_agents", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["api_key_id"],
            ["api_keys.id"],
            name="fk_budgets_api_key_id_api_keys",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["task_id"], ["tasks.id"], name="fk_budgets_task_id_tasks", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_budgets"),
    )
    op.create_index("ix_budgets_workspace_id", "budgets", ["workspace_id"])
    op.create_table(
        "budget_reservations",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("workspace_id", sa.Uuid(), nullable=False),
        sa.Column(
            "budget_ids", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False
        ),
        sa.Column("amount_usd", sa.Float(), nullable=False),
        sa.Column("run_id", sa.Uuid(), nullable=True),
        sa.Column("api_key_id", sa.Uuid(), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name="fk_budget_reservations_workspace_id_workspaces",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_budget_reservations"),
    )
    op.create_index("ix_budget_reservations_run_id", "budget_reservations", ["run_id"])
    op.create_index("ix_budget_reservations_expires_at", "budget_reservations", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_budget_reservations_expires_at", table_name="budget_reservations")
    op.drop_index("ix_budget_reservations_run_id", table_name="budget_reservations")
    op.drop_table("budget_reservations")
    op.drop_index("ix_budgets_workspace_id", table_name="budgets")
    op.drop_table("budgets")
    op.drop_index("ix_cost_events_task_id", table_name="cost_events")
    with op.batch_alter_table("cost_events") as batch:
        batch.drop_constraint("ck_cost_events_source", type_="check")
        batch.drop_column("estimated")
        batch.drop_column("source")
        batch.drop_column("task_id")
