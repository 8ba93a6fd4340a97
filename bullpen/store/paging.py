"""Keyset pagination on (created_at, id): one page of rows, and where the next one starts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar
from uuid import UUID

import sqlalchemy as sa

from bullpen.store.base import Connection

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of rows, and the (created_at, id) the next page starts after (None: last)."""

    rows: list[T]
    next_after: tuple[datetime, UUID] | None

    def map(self, build: Callable[[T], R]) -> Page[R]:
        """The same page with each row built into something else (a typed record)."""
        return Page([build(row) for row in self.rows], self.next_after)


async def keyset(
    conn: Connection,
    query: sa.Select[Any],
    created_col: sa.ColumnElement[datetime],
    id_col: sa.ColumnElement[UUID],
    *,
    limit: int,
    after: tuple[datetime, UUID] | None,
    newest_first: bool,
) -> Page[Any]:
    """Run `query` for the page after `after`, ordered on (created_col, id_col).

    One row past `limit` is read to learn whether another page follows, so no count is needed.
    """
    if after is not None:
        created, last_id = after
        if newest_first:
            past = sa.or_(created_col < created, sa.and_(created_col == created, id_col < last_id))
        else:
            past = sa.or_(created_col > created, sa.and_(created_col == created, id_col > last_id))
        query = query.where(past)
    order = (created_col.desc(), id_col.desc()) if newest_first else (created_col, id_col)
    rows = list(await conn.execute(query.order_by(*order).limit(limit + 1)))
    if len(rows) <= limit:
        return Page(rows=rows, next_after=None)
    rows = rows[:limit]
    last = rows[-1]._mapping
    return Page(rows=rows, next_after=(last[created_col], last[id_col]))
