"""The database settings: a transaction-mode pooler and the direct URL LISTEN/NOTIFY needs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from bullpen.settings import Settings

POOLED = "postgresql://bullpen@127.0.0.1:6432/bullpen"
DIRECT = "postgresql://bullpen@127.0.0.1:5432/bullpen"


def _settings(**fields: Any) -> Settings:
    return Settings(data_dir=Path("/nonexistent"), **fields)


def test_the_direct_url_defaults_to_the_database_url() -> None:
    settings = _settings(database_url=DIRECT)
    assert settings.database_pooler == "none"
    assert settings.direct_database_url == "postgresql+asyncpg://bullpen@127.0.0.1:5432/bullpen"
    assert _settings().direct_database_url is None  # SQLite: nothing to LISTEN on


def test_pgbouncer_takes_the_pooled_url_for_the_store_and_the_direct_one_for_notify() -> None:
    settings = _settings(
        database_url=POOLED, database_pooler="pgbouncer", database_direct_url=DIRECT
    )
    assert settings.resolved_database_url == "postgresql+asyncpg://bullpen@127.0.0.1:6432/bullpen"
    assert settings.direct_database_url == "postgresql+asyncpg://bullpen@127.0.0.1:5432/bullpen"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"database_url": POOLED, "database_pooler": "pgbouncer"}, "needs BULLPEN_DATABASE_DIRECT"),
        ({"database_pooler": "pgbouncer", "database_direct_url": DIRECT}, "needs a PostgreSQL"),
        ({"database_url": "sqlite:///x.db", "database_direct_url": DIRECT}, "needs a PostgreSQL"),
        ({"database_direct_url": DIRECT}, "needs a PostgreSQL"),
        ({"database_url": POOLED, "database_direct_url": "sqlite:///x.db"}, "postgresql://"),
        ({"database_url": POOLED, "database_direct_url": "mysql://x/y"}, "postgresql://"),
        ({"database_url": POOLED, "database_pooler": "pgcat"}, "'none' or 'pgbouncer'"),
        ({"database_url": POOLED, "database_pooler": "session"}, "'none' or 'pgbouncer'"),
    ],
)
def test_bad_pooler_settings_are_refused(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        _settings(**fields)


def test_the_environment_names_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BULLPEN_DATABASE_URL", POOLED)
    monkeypatch.setenv("BULLPEN_DATABASE_POOLER", "pgbouncer")
    monkeypatch.setenv("BULLPEN_DATABASE_DIRECT_URL", DIRECT)
    settings = Settings()
    assert (settings.database_pooler, settings.direct_database_url) == (
        "pgbouncer",
        "postgresql+asyncpg://bullpen@127.0.0.1:5432/bullpen",
    )
