"""The task list's search (title or prompt holds the text), the same on every backend, and the
trigram indexes that serve it (migration 0020): a GIN index per column on PostgreSQL, an FTS5
table on SQLite, filled in batches off the create path (migration 0023): a new task waits in
`tasks_search_pending`, where the search finds it too, until `index_all_pending` moves it."""

from __future__ import annotations

import asyncio
import re
import uuid
from datetime import timedelta

import pytest
import sqlalchemy as sa

from bullpen.services.searchindex import SearchIndexer
from bullpen.store import tasks as task_store
from bullpen.store.base import Connection, Store
from bullpen.store.tables import tasks
from tests.support.seed import NOW, workspace_with_agent

TEXTS = [
    ("Quarterly revenue", "Compute the quarterly numbers for the board."),
    ("Churn cohorts", "Which CUSTOMERS left in Q3, and why?"),
    ("100% done_ish", 'Escape "quotes", 50% and under_scores literally.'),
    ("Résumé screening", "Read the RÉSUMÉS and rank them."),
    ("Invoice anomalies", "Find invoices whose totals look wrong."),
]


async def _tasks(
    store: Store, texts: list[tuple[str, str]], slug: str = "w1", *, indexed: bool = True
) -> list[uuid.UUID]:
    """A workspace with these (title, prompt) tasks, one second apart, oldest first; moved
    into SQLite's search index unless `indexed` is False (then they are pending)."""
    ws, agent = await workspace_with_agent(store, slug)
    ids = []
    async with store.write() as conn:
        for i, (title, prompt) in enumerate(texts):
            task, _ = await task_store.insert_task_with_run(
                conn,
                workspace_id=ws,
                agent_id=agent,
                title=title,
                prompt=prompt,
                now=NOW + timedelta(seconds=i),
            )
            ids.append(task.id)
    if indexed:
        await task_store.index_all_pending(store)
    return ids


async def _in_index(store: Store, text: str) -> set[int]:
    """SQLite: the rowids the FTS5 index itself matches for `text`."""
    phrase = '"' + text.replace('"', '""') + '"'
    async with store.read() as conn:
        found = await conn.execute(
            sa.text("SELECT rowid FROM tasks_search WHERE tasks_search MATCH :p"), {"p": phrase}
        )
        return {int(r[0]) for r in found}


async def _pending(store: Store) -> list[int]:
    async with store.read() as conn:
        found = await conn.execute(sa.text("SELECT task_rowid FROM tasks_search_pending"))
        return sorted(int(r[0]) for r in found)


async def _rowid(store: Store, task_id: uuid.UUID) -> int:
    async with store.read() as conn:
        found = await conn.execute(sa.select(task_store._ROWID).where(tasks.c.id == task_id))
        return int(found.scalar_one())


async def _index_is_whole(store: Store) -> None:
    """SQLite: FTS5's own check of the index against the tasks (every task in it, with the
    text it has now), once nothing is pending; it raises on a difference."""
    assert await _pending(store) == []
    async with store.write() as conn:
        await conn.execute(
            sa.text("INSERT INTO tasks_search (tasks_search, rank) VALUES ('integrity-check', 1)")
        )


async def _search(store: Store, ws: uuid.UUID, text: str, limit: int = 50) -> list[uuid.UUID]:
    found: list[uuid.UUID] = []
    after = None
    while True:
        async with store.read() as conn:
            page = await task_store.list_tasks(
                conn, ws, limit=limit, after=after, search=text, dialect=store.dialect
            )
        found += [t.id for t in page.rows]
        if page.next_after is None:
            return found
        after = page.next_after


async def _workspace_of(store: Store, task_id: uuid.UUID) -> uuid.UUID:
    async with store.read() as conn:
        return uuid.UUID(
            str(
                (
                    await conn.execute(sa.select(tasks.c.workspace_id).where(tasks.c.id == task_id))
                ).scalar_one()
            )
        )


async def test_search_finds_a_substring_of_the_title_or_the_prompt_in_any_case(
    store: Store,
) -> None:
    ids = await _tasks(store, TEXTS)
    ws = await _workspace_of(store, ids[0])
    quarterly, churn, literal, resume, invoice = ids
    assert await _search(store, ws, "QUARTERLY") == [quarterly]  # title and prompt: once
    assert await _search(store, ws, "customers left") == [churn]  # the prompt, any case
    assert await _search(store, ws, "voice") == [invoice]  # inside a word
    assert await _search(store, ws, "e") == [invoice, resume, literal, churn, quarterly]
    assert await _search(store, ws, "Q3") == [churn]  # two characters: no trigram to use
    assert await _search(store, ws, "50%") == [literal]  # wildcards are literal text
    assert await _search(store, ws, "% d") == [literal]
    assert await _search(store, ws, "under_sc") == [literal]
    assert await _search(store, ws, "der_") == [literal]
    assert await _search(store, ws, "un_er") == []  # `_` is not "any character"
    assert await _search(store, ws, '"quotes"') == [literal]
    assert await _search(store, ws, 'e "q') == [literal]
    assert await _search(store, ws, "RÉSUMÉS") == [resume]  # beyond ASCII: the same case
    assert await _search(store, ws, "résumé screening") == [resume]  # ASCII letters fold
    assert await _search(store, ws, "nothing like it") == []


async def test_search_pages_newest_first_and_stays_in_its_workspace(store: Store) -> None:
    mine = await _tasks(store, [(f"Report {i}", "Summarise the metrics.") for i in range(7)])
    theirs = await _tasks(store, [("Report x", "Summarise the metrics.")], slug="w2")
    ws = await _workspace_of(store, mine[0])
    assert await _search(store, ws, "summarise", limit=3) == mine[::-1]
    assert theirs[0] not in await _search(store, await _workspace_of(store, theirs[0]), "zzz")
    assert await _search(store, await _workspace_of(store, theirs[0]), "report") == theirs


@pytest.mark.parametrize("indexed", [True, False], ids=["indexed", "pending"])
async def test_search_follows_a_changed_title_and_a_deleted_task(
    store: Store, indexed: bool
) -> None:
    ids = await _tasks(store, TEXTS, indexed=indexed)
    ws = await _workspace_of(store, ids[0])
    async with store.write() as conn:
        await task_store.update_task(conn, ws, ids[0], {"title": "Yearly outlook"}, NOW)
        await conn.execute(tasks.delete().where(tasks.c.id == ids[4]))
    assert await _search(store, ws, "yearly out") == [ids[0]]
    assert await _search(store, ws, "quarterly") == [ids[0]]  # its prompt still says so
    assert await _search(store, ws, "Quarterly revenue") == []
    assert await _search(store, ws, "invoices") == []
    if store.is_sqlite:
        assert await task_store.index_all_pending(store) == (0 if indexed else 4)
        await _index_is_whole(store)
        assert await _search(store, ws, "yearly out") == [ids[0]]
        assert await _search(store, ws, "Quarterly revenue") == []
        assert await _search(store, ws, "invoices") == []


async def test_a_new_task_is_found_before_it_is_indexed_and_after(store: Store) -> None:
    """The create writes no index (SQLite: the rowid waits in the queue), yet the search
    finds the task at once; `index_all_pending` then moves it into the index."""
    ids = await _tasks(store, TEXTS[:2], indexed=False)
    ws = await _workspace_of(store, ids[0])
    assert await _search(store, ws, "customers left") == [ids[1]]
    if not store.is_sqlite:
        assert await task_store.index_all_pending(store) == 0  # GIN indexes need no help
        return
    rowids = [await _rowid(store, task_id) for task_id in ids]
    assert await _pending(store) == rowids
    assert await _in_index(store, "customers left") == set()
    assert await task_store.index_all_pending(store) == 2
    assert await _pending(store) == []
    assert await _in_index(store, "customers left") == {rowids[1]}
    assert await _search(store, ws, "customers left") == [ids[1]]
    await _index_is_whole(store)


async def test_the_indexer_takes_pending_tasks_oldest_first_a_batch_at_a_time(
    store: Store,
) -> None:
    if not store.is_sqlite:
        pytest.skip("SQLite's index only: PostgreSQL's GIN indexes keep their own lists")
    ids = await _tasks(store, [(f"Batch {i}", "Index me") for i in range(5)], indexed=False)
    rowids = [await _rowid(store, task_id) for task_id in ids]

    async def take_two(conn: Connection) -> int:
        return await task_store.index_pending(conn, 2)

    assert [await store.write_apart(take_two) for _ in range(4)] == [2, 2, 1, 0]
    assert await _in_index(store, "Batch 1") == {rowids[1]}
    assert await _in_index(store, "Index me") == set(rowids)
    await _index_is_whole(store)


async def test_a_rowid_sqlite_gives_again_is_indexed_afresh(store: Store) -> None:
    """SQLite gives a new row the highest rowid plus one: after the newest task is deleted,
    the next task gets its rowid. The index must then hold the new task's text, not the old
    one's, whether the deleted task had been indexed or not."""
    if not store.is_sqlite:
        pytest.skip("SQLite's rowids and index only")
    for indexed, word in ((True, "alpha"), (False, "omega")):
        kept, gone = await _tasks(
            store, [("Kept", "Stays"), ("Gone", f"Deleted {word}")], word, indexed=indexed
        )
        ws = await _workspace_of(store, kept)
        reused = await _rowid(store, gone)
        async with store.write() as conn:
            await conn.execute(tasks.delete().where(tasks.c.id == gone))
        (new,) = await _tasks(store, [("Fresh", f"New {word}")], f"{word}-2")
        assert await _rowid(store, new) == reused
        assert await _in_index(store, f"New {word}") == {reused}
        assert await _in_index(store, f"Deleted {word}") == set()
        assert await _search(store, ws, f"deleted {word}") == []
        assert await _search(store, await _workspace_of(store, new), f"new {word}") == [new]
        await _index_is_whole(store)


async def test_the_indexer_service_empties_the_queue_while_tasks_arrive(store: Store) -> None:
    if not store.is_sqlite:
        pytest.skip("SQLite's index only")
    async with SearchIndexer(store, interval_s=0.01):
        ids = await _tasks(store, [(f"Live {i}", "Arriving") for i in range(450)], indexed=False)
        for _ in range(500):
            if not await _pending(store):
                break
            await asyncio.sleep(0.01)
    assert await _in_index(store, "Arriving") == {await _rowid(store, i) for i in ids}
    await _index_is_whole(store)


async def test_a_common_text_is_searched_by_the_newest_first_scan(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past SEARCH_CANDIDATES_MAX matches the trigram index is not used on SQLite (and the
    planner decides on PostgreSQL): the results are the same either way."""
    ids = await _tasks(store, [(f"Metrics {i}", "Extract the key metrics.") for i in range(6)])
    ws = await _workspace_of(store, ids[0])
    indexed = await _search(store, ws, "key metrics", limit=4)
    monkeypatch.setattr(task_store, "SEARCH_CANDIDATES_MAX", 3)
    assert await _search(store, ws, "key metrics", limit=4) == indexed == ids[::-1]
    assert await _search(store, ws, "Metrics 4") == [ids[4]]


async def test_the_trigram_index_serves_the_search(store: Store) -> None:
    """EXPLAIN: PostgreSQL can answer ILIKE '%…%' from the GIN trigram indexes; SQLite reads
    the candidates from the FTS5 index, then the tasks by rowid."""
    ids = await _tasks(store, TEXTS)
    ws = await _workspace_of(store, ids[0])

    def plans(sync_conn: sa.Connection) -> list[str]:
        if sync_conn.dialect.name == "postgresql":
            sync_conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
            out = []
            for column in ("title", "prompt"):
                rows = sync_conn.exec_driver_sql(
                    f"EXPLAIN SELECT id FROM tasks WHERE {column} ILIKE '%quarterly%'"
                )
                out.append("\n".join(str(r[0]) for r in rows))
            return out
        match = sync_conn.exec_driver_sql(
            "EXPLAIN QUERY PLAN SELECT rowid FROM tasks_search WHERE tasks_search MATCH "
            "'\"quarterly\"'"
        )
        # The list's own query, as SQLite runs it with candidates (a top-level filter too).
        listed = sa.select(tasks.c.id).where(
            task_store._unindexed(tasks.c.workspace_id) == ws,
            task_store._unindexed(tasks.c.parent_id).is_(None),
            task_store._ROWID.in_([1, 2]),
        )
        compiled = (
            listed.order_by(tasks.c.created_at.desc())
            .limit(51)
            .compile(dialect=sync_conn.dialect, compile_kwargs={"render_postcompile": True})
        )
        values = [compiled.params[name] for name in compiled.positiontup or []]
        by_rowid = sync_conn.exec_driver_sql(
            f"EXPLAIN QUERY PLAN {compiled}",
            tuple(v.hex if isinstance(v, uuid.UUID) else v for v in values),
        )
        return [" | ".join(str(r[3]) for r in rows) for rows in (match, by_rowid)]

    async with store.write() as conn:  # a transaction: SET LOCAL ends with it
        title_plan, prompt_plan = await conn.run_sync(plans)
    if store.dialect == "postgresql":
        assert "ix_tasks_title_trgm" in title_plan, title_plan
        assert "ix_tasks_prompt_trgm" in prompt_plan, prompt_plan
    else:
        # FTS5's own index answers MATCH (its plan's `M`: a full-text query; a scan has none).
        assert re.search(r"VIRTUAL TABLE INDEX \d+:M", title_plan), title_plan
        assert "USING INTEGER PRIMARY KEY (rowid=?)" in prompt_plan, prompt_plan
