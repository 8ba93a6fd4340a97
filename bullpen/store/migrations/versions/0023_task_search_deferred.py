"""task search, SQLite: the trigram index filled in batches off the create path

Migration 0020's trigger indexed every new task's title and prompt in `tasks_search` inside
the create's transaction: about 150 µs of a SQLite create, under the write lock. A new task's
rowid now goes to `tasks_search_pending` instead (a few µs), and `bullpen.store.tasks.
index_pending` moves pending tasks into the index in batches, which costs a fifth as much per
task. The search reads pending tasks as candidates beside the index's matches, so a task is
found the moment it exists.

The delete and update triggers touch the index only for a task already in it (its rowid is
not pending); a pending task's rowid simply leaves the queue, so a rowid SQLite gives again
to a new task is queued afresh.

PostgreSQL: nothing changes (its GIN indexes keep their own pending lists).

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06 15:30:00
"""

from __future__ import annotations

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

_UP = (
    "CREATE TABLE tasks_search_pending (task_rowid INTEGER PRIMARY KEY)",
    "DROP TRIGGER tr_tasks_search_insert",
    "DROP TRIGGER tr_tasks_search_delete",
    "DROP TRIGGER tr_tasks_search_update",
    """CREATE TRIGGER tr_tasks_search_insert AFTER INSERT ON tasks BEGIN
        INSERT INTO tasks_search_pending (task_rowid) VALUES (NEW.rowid);
    END""",
    """CREATE TRIGGER tr_tasks_search_delete AFTER DELETE ON tasks BEGIN
        INSERT INTO tasks_search (tasks_search, rowid, title, prompt)
        SELECT 'delete', OLD.rowid, OLD.title, OLD.prompt WHERE NOT EXISTS (
            SELECT 1 FROM tasks_search_pending WHERE task_rowid = OLD.rowid
        );
        DELETE FROM tasks_search_pending WHERE task_rowid = OLD.rowid;
    END""",
    """CREATE TRIGGER tr_tasks_search_update AFTER UPDATE OF title, prompt ON tasks
    WHEN NOT EXISTS (SELECT 1 FROM tasks_search_pending WHERE task_rowid = OLD.rowid) BEGIN
        INSERT INTO tasks_search (tasks_search, rowid, title, prompt)
        VALUES ('delete', OLD.rowid, OLD.title, OLD.prompt);
        INSERT INTO tasks_search (rowid, title, prompt)
        VALUES (NEW.rowid, NEW.title, NEW.prompt);
    END""",
)
_DOWN = (
    # Index what is pending, then index every new task at once again (migration 0020's).
    """INSERT INTO tasks_search (rowid, title, prompt)
    SELECT t.rowid, t.title, t.prompt FROM tasks_search_pending p
    JOIN tasks t ON t.rowid = p.task_rowid""",
    "DROP TRIGGER tr_tasks_search_insert",
    "DROP TRIGGER tr_tasks_search_delete",
    "DROP TRIGGER tr_tasks_search_update",
    "DROP TABLE tasks_search_pending",
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
)


def _run(statements: tuple[str, ...]) -> None:
    if op.get_bind().dialect.name == "sqlite":
        for statement in statements:
            op.execute(statement)


def upgrade() -> None:
    _run(_UP)


def downgrade() -> None:
    _run(_DOWN)
