"""Time-ordered row ids (UUIDv7, RFC 9562) for the tables that grow fastest.

A random UUIDv4 key lands each insert on a random leaf of every index it is part of: as a
table outgrows the page cache, every insert reads pages back from disk, and every commit writes
as many leaves as there are such indexes (issue 21: SQLite's creates slowed round after round
as the database grew). A UUIDv7 starts with the time in milliseconds, so new rows go to the
right-hand edge of the index, which stays cached and is shared by writers in one commit.

They reveal when a row was made, which the API already shows for these rows; ids that name a
secret or an identity (API keys, sessions, users, workspaces) stay random.
"""

from __future__ import annotations

import os
import time
from uuid import UUID

_RAND_A = (1 << 12) - 1
_RAND_B = (1 << 62) - 1


def time_ordered_id() -> UUID:
    """A new UUIDv7: 48 bits of Unix time in ms, the version, 74 random bits, the variant."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (
        (ms & ((1 << 48) - 1)) << 80
        | 0x7 << 76
        | ((rand >> 62) & _RAND_A) << 64
        | 0b10 << 62
        | (rand & _RAND_B)
    )
    return UUID(int=value)
