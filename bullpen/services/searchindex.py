"""The task search's trigram index on SQLite, filled in batches off the create path.

A new task's rowid waits in `tasks_search_pending` (migration 0023) and the search reads it
as a candidate beside the index's matches, so it is found at once; this moves pending tasks
into the index a batch per transaction, each on a worker thread (`Store.write_apart`), so
neither a create nor the event loop pays for the tokenizing. PostgreSQL needs none of it.
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy.exc import DBAPIError

from bullpen.errors import BullpenError
from bullpen.store import tasks as task_store
from bullpen.store.base import Store

log = logging.getLogger(__name__)

INTERVAL_S = 1.0


class SearchIndexer:
    """Runs `index_all_pending` every `interval_s` while open (SQLite only)."""

    def __init__(self, store: Store, interval_s: float = INTERVAL_S) -> None:
        self._store = store
        self._interval = interval_s
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> SearchIndexer:
        if self._store.is_sqlite:
            self._task = asyncio.create_task(self._loop(), name="bullpen-search-index")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await task_store.index_all_pending(self._store)
            except BullpenError as err:
                log.warning("indexing tasks for search failed: %s", err.detail)
            except DBAPIError as err:  # the search still finds pending tasks, by scanning them
                log.warning("indexing tasks for search failed: %s", err.orig)
