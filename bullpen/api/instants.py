"""Instants and time ranges in query strings: RFC 3339 date-times, a time without an offset
read as UTC, and a `since` (inclusive) / `until` (exclusive) pair checked once for the API and
the dashboard alike."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Annotated

from pydantic import BeforeValidator, TypeAdapter, ValidationError

from bullpen.errors import InvalidInput

_NUMBER = re.compile(r"\s*[+-]?[0-9.]+([eE][+-]?[0-9]+)?\s*")


def _not_a_number(value: object) -> object:
    if isinstance(value, (int, float)) or (isinstance(value, str) and _NUMBER.fullmatch(value)):
        raise ValueError("expected an RFC 3339 date-time, not a number")
    return value


# An RFC 3339 date-time (a date alone is its midnight). Pydantic would also read a number as
# seconds since 1970: refused.
Instant = Annotated[datetime, BeforeValidator(_not_a_number)]
_INSTANT: TypeAdapter[datetime] = TypeAdapter(Instant)


def _invalid(field: str, message: str, code: str) -> InvalidInput:
    return InvalidInput(
        f"{field}: {message}",
        errors=[{"location": "query", "field": field, "message": message, "code": code}],
    )


def utc(value: datetime, field: str) -> datetime:
    """`value` in UTC (without an offset it is UTC already); one that leaves datetime's range on
    the way (year 1 east of UTC, 9999 west of it) is InvalidInput naming `field`."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise _invalid(field, "out of range once moved to UTC", "datetime_range") from None


def parse(text: str, field: str) -> datetime | None:
    """A form's or query string's instant, in UTC (empty: None); InvalidInput naming `field`."""
    if not text.strip():
        return None
    try:
        value = _INSTANT.validate_python(text.strip())
    except ValidationError:
        raise _invalid(
            field, "not a date and time (RFC 3339, e.g. 2026-01-31T09:30:00Z; UTC)", "datetime"
        ) from None
    return utc(value, field)


def time_range(
    since: datetime | None, until: datetime | None
) -> tuple[datetime | None, datetime | None]:
    """`since` (inclusive) and `until` (exclusive) in UTC; `until` before `since` is
    InvalidInput naming `until` (the same instant is an empty range)."""
    start = None if since is None else utc(since, "since")
    end = None if until is None else utc(until, "until")
    if start is not None and end is not None and end < start:
        raise _invalid("until", "must not be before since", "range")
    return start, end


def window(
    since: datetime | None, until: datetime | None, *, now: datetime, days: int
) -> tuple[datetime, datetime]:
    """`since` and `until` in UTC with defaults: `until` now, `since` `days` before `until`
    (or the earliest instant, for an `until` within `days` of it)."""
    end = now if until is None else utc(until, "until")
    if since is not None:
        return utc(since, "since"), end
    earliest = datetime.min.replace(tzinfo=UTC)
    return (end - timedelta(days=days) if end - earliest > timedelta(days=days) else earliest), end
