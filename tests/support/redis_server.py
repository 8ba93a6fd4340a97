"""The Redis server the tests use, one database number per pytest-xdist worker.

Bullpen's Redis bus appends to one fixed stream key (`bullpen:events`), so two workers' server
processes on the same database number would read each other's events. Each worker gets its own
number instead: gw0 → 1, gw1 → 2, ... (0 outside xdist). Tests that make their own keys
(`bullpen:test:<uuid>`) may use any number.
"""

from __future__ import annotations

import os

BASE_URL = os.environ.get("BULLPEN_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
_DATABASES = 16  # Redis's default `databases`


def worker_db() -> int:
    """This process's database number."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return 0
    return 1 + int(worker[2:]) % (_DATABASES - 1)


REDIS_URL = f"{BASE_URL.rsplit('/', 1)[0]}/{worker_db()}"
