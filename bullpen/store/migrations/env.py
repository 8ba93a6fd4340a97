"""Alembic environment: runs migrations on the connection `bullpen.store.migrate` hands in."""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from bullpen.store.tables import metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations with `bullpen migrate`, which supplies the connection")
_run(connection)
