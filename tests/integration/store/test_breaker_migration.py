"""Migration 0014 (breakers and key rates) goes up, down and up again on both backends, with
its columns and indexes."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command

from bullpen.store.base import Store
from bullpen.store.migrate import alembic_config

COLUMNS = {
    "agents": {"breakers", "paused_reason", "breaker_since", "failures_in_a_row"},
    "api_keys": {"rpm_limit", "tpm_limit"},
}
INDEXES = {"runs": "ix_runs_agent_started", "cost_events": "ix_cost_events_agent_priced"}


Schema = tuple[dict[str, set[str]], dict[str, set[str]]]


def _schema(connection: sa.Connection) -> Schema:
    inspector = sa.inspect(connection)
    columns = {t: {c["name"] for c in inspector.get_columns(t)} for t in COLUMNS}
    indexes = {t: {i["name"] or "" for i in inspector.get_indexes(t)} for t in INDEXES}
    return columns, indexes


async def test_0014_goes_up_down_and_up_again(bare: Store) -> None:
    def move_and_look(connection: sa.Connection, target: str, down: bool) -> Schema:
        config = alembic_config(connection)
        (command.downgrade if down else command.upgrade)(config, target)
        return _schema(connection)

    async def at(target: str, *, down: bool = False) -> Schema:
        return await bare.run_sync(lambda c: move_and_look(c, target, down))

    columns, indexes = await at("0014")
    for table, added in COLUMNS.items():
        assert added <= columns[table]
    for table, index in INDEXES.items():
        assert index in indexes[table]
    columns, indexes = await at("0013", down=True)
    for table, added in COLUMNS.items():
        assert not added & columns[table]
    for table, index in INDEXES.items():
        assert index not in indexes[table]
    columns, _ = await at("0014")
    assert COLUMNS["agents"] <= columns["agents"]
