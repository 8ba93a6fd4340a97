"""A PostgreSQL server with no room for another connection is a 503 to retry, not a 500.

The refusal is real: a role whose `CONNECTION LIMIT` is 0 gets SQLSTATE 53300 (too many
connections), as every client does once the server's `max_connections` is reached.
"""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from bullpen.errors import Unavailable
from bullpen.settings import Settings
from bullpen.store.engine import create_store
from tests.support.postgres import admin


@pytest.mark.parametrize("backend", ["postgres"])
async def test_a_server_out_of_connections_is_unavailable_not_an_error(settings: Settings) -> None:
    role = f"bp_full_{uuid.uuid4().hex[:10]}"
    await admin(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 0')
    try:
        url = make_url(settings.resolved_database_url).set(username=role, password=None)
        limited = url.render_as_string(hide_password=False)
        store = create_store(settings.model_copy(update={"database_url": limited}))
        try:
            with pytest.raises(Unavailable) as raised:
                async with store.read() as conn:
                    await conn.execute(sa.text("SELECT 1"))
        finally:
            await store.close()
    finally:
        await admin(f'DROP ROLE "{role}"')
    assert raised.value.status == 503 and raised.value.retry_after is not None
