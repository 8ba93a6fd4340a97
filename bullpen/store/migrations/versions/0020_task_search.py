"""task search: trigram indexes on tasks' titles and prompts (the dashboard's search)

PostgreSQL: the `pg_trgm` extension and a GIN trigram index on each of `tasks.title` and
`tasks.prompt`, which serve `ILIKE '%text%'`. `pg_trgm` is a trusted extension (PostgreSQL 13
and later): a role with CREATE on the database may add it, no superuser needed.

SQLite: `tasks_search`, an FTS5 table with the trigram tokenizer over the same two columns,
external content (it stores only its index, the text stays in `tasks`), kept in step by
triggers on `tasks`; filled from the existing rows here.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06 10:00:00
"""

from __future__ import annotations

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

_PG_UP = (
    "CREATE EXTENSION IF NOT EXISTS pg_trgm",
    "CREATE INDEX ix_tasks_title_trgm ON tasks USING gin (title gin_trgm_ops)",
    "CREATE INDEX ix_tasks_prompt_trgm ON tasks USING gin (prompt gin_trgm_ops)",
)
_PG_DOWN = ("DROP INDEX ix_tasks_prompt_trgm", "DROP INDEX ix_tasks_title_trgm")

_SQLITE_UP = (
    "CREATE VIRTUAL TABLE tasks_search USING fts5(title, prompt, content='tasks', "
    "content_rowid='rowid', tokenize='trigram')",
    """CREATE TRIGGER tr_tasks_search_insert AFTER INSERT ON tasks BEGIN
        INSERT INTO tasks_search (rowid, title, prompt)
        VALUES (NEW.rowid, NEW.title, NEW.prompt);
    END""",
    """CREATE TRIGGER tr_tasks_search_delete AFTER DELETE ON tasks BEGIN
        INSERT INTO tasks_search (tasks_search, rowid, title, prompt)
        VALUES ('delete', OLD.rowid, OLD.title, OLD.prompt);
    END""",
    """CREATE TRIGGER tr_tasks_search_update AFTER UPDATE OF title, prompt ON tasks BEGIN
        INSERT INTO tasks_search (tasks_search, rowid, title, prompt)
        VALUES ('delete', OLD.rowid, OLD.title, OLD.prompt);
        INSERT INTO tasks_search (rowid, title, prompt)
        VALUES (NEW.rowid, NEW.title, NEW.prompt);
    END""",
    "INSERT INTO tasks_search (tasks_search) VALUES ('rebuild')",
)
_SQLITE_DOWN = (
    "DROP TRIGGER tr_tasks_search_update",
    "DROP TRIGGER tr_tasks_search_delete",
    "DROP TRIGGER tr_tasks_search_insert",
    "DROP TABLE tasks_search",
)


def _run(postgres: tuple[str, ...], sqlite: tuple[str, ...]) -> None:
    for statement in postgres if op.get_bind().dialect.name == "postgresql" else sqlite:
        op.execute(statement)


def upgrade() -> None:
    _run(_PG_UP, _SQLITE_UP)


def downgrade() -> None:
    # The extension stays: other schemas of the database may use it.
    _run(_PG_DOWN, _SQLITE_DOWN)
