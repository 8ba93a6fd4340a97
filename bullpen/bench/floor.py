"""The create scenario's floor: a bare `POST /api/v1/tasks` on Bullpen's framework and driver.

Issue 21 asks Bullpen's create path for at least half the creates/s of "a bare endpoint (same
framework, same driver, one insert per request)". This is that endpoint, run as its own
process (`python -m bullpen.bench.floor --backend sqlite|postgres --port N --database-url U`)
and measured by `--scenario create` in the same run as Bullpen, with the same client and the
same CPU accounting:

- FastAPI served by uvicorn on uvloop and httptools, no access log (as `bullpen up`);
- the handler checks that an `Authorization: Bearer …` header is present (it checks no key),
  parses the JSON body into a pydantic model (`prompt`, `agent_id`), inserts one row into a
  one-table database and answers 201 with a small JSON body;
- SQLite: SQLAlchemy Core on sqlite3 in WAL, the transaction run inline on the event loop
  (`BEGIN IMMEDIATE`, as Bullpen's store runs its writes); PostgreSQL: SQLAlchemy's async
  engine on asyncpg with Bullpen's default pool size and overflow (read from `Settings`).

What it leaves out is what Bullpen's create does on top: the key's lookup and permissions,
rate limiting, idempotency, the task + run + audit rows, the wake-up of workers.

This is the one module of `bullpen.bench` that imports FastAPI and SQLAlchemy: the import
contracts in pyproject.toml make a named exception for it (`ignore_imports`). Nothing else
imports it; it runs only as its own process.
"""

from __future__ import annotations

import argparse
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import orjson
import sqlalchemy as sa
import uvicorn
from fastapi import FastAPI, Request, Response
from pydantic import BaseModel, Field, ValidationError
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from bullpen.settings import Settings

__all__ = ["build_app", "main"]

_metadata = sa.MetaData()
tasks = sa.Table(
    "floor_tasks",
    _metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("agent_id", sa.String(64), nullable=False),
    sa.Column("prompt", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)
_JSON = "application/json"


class TaskIn(BaseModel):
    """The body the bench sends."""

    prompt: str = Field(min_length=1, max_length=32_000)
    agent_id: str = Field(min_length=1, max_length=64)


def _problem(status: int, title: str) -> Response:
    body = orjson.dumps({"type": "about:blank", "title": title, "status": status})
    return Response(body, status_code=status, media_type="application/problem+json")


def _sqlite_engine(url: str) -> sa.Engine:
    engine = sa.create_engine(url, pool_size=4, max_overflow=0)

    def connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # SQLAlchemy begins, as in Bullpen's store
        cursor = dbapi_connection.cursor()
        for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "busy_timeout=5000"):
            cursor.execute(f"PRAGMA {pragma}")
        cursor.close()

    def begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    event.listen(engine, "connect", connect)
    event.listen(engine, "begin", begin)
    return engine


def build_app(database_url: str) -> FastAPI:
    """The floor's app on `database_url` (sqlite:///path or postgresql+asyncpg://…)."""
    insert = tasks.insert()
    store: sa.Engine | AsyncEngine
    if database_url.startswith("sqlite"):
        store = _sqlite_engine(database_url)
    else:
        defaults = Settings.model_fields
        store = create_async_engine(
            database_url,
            pool_size=defaults["pool_size"].default,
            max_overflow=defaults["pool_max_overflow"].default,
        )

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if isinstance(store, sa.Engine):
            _metadata.create_all(store)
            yield
            store.dispose()
            return
        async with store.begin() as conn:
            await conn.run_sync(_metadata.create_all)
        yield
        await store.dispose()

    if isinstance(store, sa.Engine):
        sync_engine = store

        async def write(row: dict[str, Any]) -> None:
            # Inline on the loop, no thread hop: what Bullpen's InlineConnection does.
            with sync_engine.begin() as conn:
                conn.execute(insert, row)

    else:
        async_engine = store

        async def write(row: dict[str, Any]) -> None:
            async with async_engine.begin() as conn:
                await conn.execute(insert, row)

    app = FastAPI(lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None)
    _routes(app, write)
    return app


def _routes(app: FastAPI, write: Callable[[dict[str, Any]], Any]) -> None:
    @app.get("/healthz")
    async def healthz() -> Response:
        return Response(b'{"status":"ok"}', media_type=_JSON)

    @app.post("/api/v1/tasks")
    async def create(request: Request) -> Response:
        auth = request.headers.get("authorization", "")
        if not auth.startswith("Bearer ") or len(auth) <= len("Bearer "):
            return _problem(401, "Missing bearer token")
        try:
            body = TaskIn.model_validate_json(await request.body())
        except ValidationError:
            return _problem(422, "Invalid body")
        task_id, now = str(uuid.uuid4()), datetime.now(UTC)
        await write(
            {"id": task_id, "agent_id": body.agent_id, "prompt": body.prompt, "created_at": now}
        )
        out = {"id": task_id, "agent_id": body.agent_id, "status": "queued"}
        out["created_at"] = now.isoformat()
        return Response(orjson.dumps(out), status_code=201, media_type=_JSON)


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m bullpen.bench.floor`: serve the floor until SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m bullpen.bench.floor", description=__doc__)
    parser.add_argument(
        "--database-url", required=True, help="sqlite:///… or postgresql+asyncpg://…"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    if not args.database_url.startswith(("sqlite:///", "postgresql+asyncpg://")):
        parser.error("--database-url must be sqlite:///… or postgresql+asyncpg://…")
    uvicorn.run(
        build_app(args.database_url),
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_config=None,
        backlog=4096,
    )


if __name__ == "__main__":
    main()
