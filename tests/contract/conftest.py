"""The store and queue contracts run on a third backend: PostgreSQL through PgBouncer in
transaction mode (tests/support/pgbouncer.py).

Fixtures and hooks only.
"""

from __future__ import annotations

import pytest

from tests.support.servers import BACKENDS


@pytest.fixture(params=[*BACKENDS, "pgbouncer"])
def backend(request: pytest.FixtureRequest) -> str:
    """Each contract test runs on SQLite, PostgreSQL, and PostgreSQL through PgBouncer."""
    param: str = request.param
    return param
