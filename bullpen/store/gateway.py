"""Providers, model routes and the cost ledger.

Names are unique per workspace (the constraints, mapped here to Conflict). Provider rows hold
their API key only as ciphertext; sealing and opening happen in the service.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

import orjson
import sqlalchemy as sa
from sqlalchemy import exc

from bullpen.domain.records.gateway import ProviderRecord, RouteRecord
from bullpen.errors import Conflict
from bullpen.store import rollups
from bullpen.store.base import Connection
from bullpen.store.ids import time_ordered_id
from bullpen.store.rollups import NO_ID
from bullpen.store.tables import cost_events, model_routes, providers

PROVIDER_UPDATABLE = frozenset(
    {
        "name",
        "base_url",
        "api_key_ciphertext",
        "api_key_hint",
        "models",
        "connect_timeout_s",
        "ttft_timeout_s",
        "idle_timeout_s",
        "deadline_s",
    }
)
ROUTE_UPDATABLE = frozenset({"name", "chain"})


async def create_provider(
    conn: Connection,
    *,
    provider_id: UUID,
    workspace_id: UUID,
    values: dict[str, Any],
    now: datetime,
) -> None:
    """Insert a provider; a taken name is Conflict."""
    try:
        await conn.execute(
            providers.insert().values(
                id=provider_id, workspace_id=workspace_id, created_at=now, updated_at=now, **values
            )
        )
    except exc.IntegrityError as err:
        raise Conflict(f"a provider named {values['name']!r} already exists here") from err


async def get_provider(
    conn: Connection, workspace_id: UUID, provider_id: UUID, *, for_update: bool = False
) -> ProviderRecord | None:
    """The provider with this id in this workspace, or None; `for_update` locks the row (on
    PostgreSQL; SQLite's one writer already excludes others) until the transaction ends."""
    query = sa.select(providers).where(
        providers.c.id == provider_id, providers.c.workspace_id == workspace_id
    )
    if for_update:
        query = query.with_for_update()
    row = (await conn.execute(query)).first()
    return ProviderRecord.of(row._mapping) if row is not None else None


async def list_providers(conn: Connection, workspace_id: UUID) -> list[ProviderRecord]:
    """The workspace's providers by name."""
    result = await conn.execute(
        sa.select(providers)
        .where(providers.c.workspace_id == workspace_id)
        .order_by(providers.c.name)
    )
    return [ProviderRecord.of(row._mapping) for row in result]


async def update_provider(
    conn: Connection, provider_id: UUID, changes: dict[str, Any], now: datetime
) -> None:
    """Change a provider's updatable columns; a taken name is Conflict."""
    if not changes.keys() <= PROVIDER_UPDATABLE:
        raise ValueError(f"not updatable: {sorted(changes.keys() - PROVIDER_UPDATABLE)}")
    try:
        await conn.execute(
            providers.update()
            .where(providers.c.id == provider_id)
            .values(**changes, updated_at=now)
        )
    except exc.IntegrityError as err:
        raise Conflict(f"a provider named {changes.get('name')!r} already exists here") from err


async def delete_provider(conn: Connection, provider_id: UUID) -> None:
    """Delete a provider."""
    await conn.execute(providers.delete().where(providers.c.id == provider_id))


async def create_route(
    conn: Connection,
    *,
    workspace_id: UUID,
    name: str,
    chain: list[dict[str, str]],
    now: datetime,
) -> UUID:
    """Insert a model route; a taken name is Conflict."""
    route_id = uuid.uuid4()
    try:
        await conn.execute(
            model_routes.insert().values(
                id=route_id,
                workspace_id=workspace_id,
                name=name,
                chain=chain,
                created_at=now,
                updated_at=now,
            )
        )
    except exc.IntegrityError as err:
        raise Conflict(f"a model route named {name!r} already exists here") from err
    return route_id


async def get_route(conn: Connection, workspace_id: UUID, route_id: UUID) -> RouteRecord | None:
    """The route with this id in this workspace, or None."""
    row = (
        await conn.execute(
            sa.select(model_routes).where(
                model_routes.c.id == route_id, model_routes.c.workspace_id == workspace_id
            )
        )
    ).first()
    return RouteRecord.of(row._mapping) if row is not None else None


async def list_routes(conn: Connection, workspace_id: UUID) -> list[RouteRecord]:
    """The workspace's model routes by name."""
    result = await conn.execute(
        sa.select(model_routes)
        .where(model_routes.c.workspace_id == workspace_id)
        .order_by(model_routes.c.name)
    )
    return [RouteRecord.of(row._mapping) for row in result]


async def update_route(
    conn: Connection, route_id: UUID, changes: dict[str, Any], now: datetime
) -> None:
    """Change a route's name or chain; a taken name is Conflict."""
    if not changes.keys() <= ROUTE_UPDATABLE:
        raise ValueError(f"not updatable: {sorted(changes.keys() - ROUTE_UPDATABLE)}")
    try:
        await conn.execute(
            model_routes.update()
            .where(model_routes.c.id == route_id)
            .values(**changes, updated_at=now)
        )
    except exc.IntegrityError as err:
        raise Conflict(f"a model route named {changes.get('name')!r} already exists here") from err


async def delete_route(conn: Connection, route_id: UUID) -> None:
    """Delete a route."""
    await conn.execute(model_routes.delete().where(model_routes.c.id == route_id))


_RECORD_COST = cost_events.insert().values(
    {
        name: sa.bindparam(name, type_=cost_events.c[name].type)
        for name in (
            "id",
            "workspace_id",
            "run_id",
            "agent_id",
            "user_id",
            "api_key_id",
            "provider",
            "model",
            "input_tokens",
            "cached_input_tokens",
            "output_tokens",
            "cost_usd",
            "created_at",
            "task_id",
            "source",
            "estimated",
        )
    }
)


# PostgreSQL: the rows come as one JSON array (one round trip whatever their number).
_PG_COST_ROWS = """
WITH r AS (
    SELECT * FROM jsonb_to_recordset(CAST(CAST(:rows AS text) AS jsonb)) AS r(
        id uuid, workspace_id uuid, run_id uuid, agent_id uuid, user_id uuid, api_key_id uuid,
        provider text, model text, input_tokens integer, cached_input_tokens integer,
        output_tokens integer, cost_usd double precision, created_at timestamptz,
        task_id uuid, source text, estimated boolean)
)"""
_PG_INSERT_COSTS = """
INSERT INTO cost_events (id, workspace_id, run_id, agent_id, user_id, api_key_id, provider,
    model, input_tokens, cached_input_tokens, output_tokens, cost_usd, created_at, task_id,
    source, estimated)
SELECT id, workspace_id, run_id, agent_id, user_id, api_key_id, provider, model,
    input_tokens, cached_input_tokens, output_tokens, cost_usd, created_at, task_id,
    source, estimated
FROM r"""
# In a write transaction the rows alone: their sums join what it adds to `cost_days` as it
# commits (`rollups.add_costs`).
_PG_RECORD_COSTS = sa.text(_PG_COST_ROWS + _PG_INSERT_COSTS)
# Outside one (the usage ledger's autocommitted batches) rows and sums in one statement, atomic
# on its own, its `cost_days` rows locked in the order every writer locks them
# (`rollups.cost_order`).
_PG_RECORD_COSTS_AND_SUMS = sa.text(
    _PG_COST_ROWS
    + ", inserted AS ("
    + _PG_INSERT_COSTS
    + """
)
INSERT INTO cost_days AS d (workspace_id, day, agent_id, api_key_id, provider, model, source,
    calls, input_tokens, cached_input_tokens, output_tokens, cost_usd)
SELECT workspace_id, CAST(timezone('UTC', created_at) AS date),
    coalesce(agent_id, CAST(:no_id AS uuid)), coalesce(api_key_id, CAST(:no_id AS uuid)),
    provider, model, source, count(*), sum(input_tokens), sum(cached_input_tokens),
    sum(output_tokens), sum(cost_usd)
FROM r
GROUP BY 1, 2, 3, 4, 5, 6, 7
ORDER BY 1, 2, 3, 4, provider COLLATE "C", model COLLATE "C", source COLLATE "C"
ON CONFLICT (workspace_id, day, agent_id, api_key_id, provider, model, source) DO UPDATE SET
    calls = d.calls + excluded.calls,
    input_tokens = d.input_tokens + excluded.input_tokens,
    cached_input_tokens = d.cached_input_tokens + excluded.cached_input_tokens,
    output_tokens = d.output_tokens + excluded.output_tokens,
    cost_usd = d.cost_usd + excluded.cost_usd
"""
)


async def record_costs(conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Append ledger rows (each a dict of every `cost_events` column but `id`; `task_id`,
    `source` and `estimated` may be left out: a row with a run is a run's), with their sums
    in the `cost_days` rollup."""
    if not rows:
        return
    filled = [
        {
            "id": time_ordered_id(),
            "task_id": None,
            "source": "run" if row.get("run_id") is not None else "relay",
            "estimated": False,
            **row,
        }
        for row in rows
    ]
    if conn.dialect.name == "postgresql":
        for row in filled:
            if row["created_at"].tzinfo is None:
                raise ValueError("naive datetime given to a UTC column")
        encoded = orjson.dumps(filled, default=str).decode()
        if not rollups.gathers(conn):
            await conn.execute(_PG_RECORD_COSTS_AND_SUMS, {"rows": encoded, "no_id": str(NO_ID)})
            return
        await conn.execute(_PG_RECORD_COSTS, {"rows": encoded})
    else:
        await conn.execute(_RECORD_COST, filled)
    await rollups.add_costs(conn, filled)
