"""Opaque keyset cursors for list endpoints."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from bullpen.errors import InvalidInput
from bullpen.store.paging import Page


def encode(created_at: datetime, row_id: UUID) -> str:
    """A cursor pointing after (created_at, id)."""
    raw = f"{created_at.isoformat()}|{row_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def after(cursor: str | None) -> tuple[datetime, UUID] | None:
    """Where the requested page starts: after the cursor's position, or at the top without one."""
    return decode(cursor) if cursor else None


def next_of(page: Page[Any]) -> str | None:
    """The cursor of the page after `page`; None when it is the last."""
    return encode(*page.next_after) if page.next_after else None


def decode(cursor: str) -> tuple[datetime, UUID]:
    """The (created_at, id) a cursor points after; malformed cursors are a 422.

    The position is moved to UTC here, as the store compares it: a crafted date that leaves
    datetime's range on the way (year 1 east of UTC, 9999 west of it) is malformed too.
    """
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        created, row_id = base64.urlsafe_b64decode(padded.encode()).decode().split("|")
        when = datetime.fromisoformat(created)
        if when.tzinfo is None:
            raise ValueError("naive")
        return when.astimezone(UTC), UUID(row_id)
    except (ValueError, UnicodeDecodeError, OverflowError) as err:
        raise InvalidInput(
            "malformed cursor",
            errors=[
                {
                    "location": "query",
                    "field": "cursor",
                    "message": "malformed cursor",
                    "code": "cursor",
                }
            ],
        ) from err
