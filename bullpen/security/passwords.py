"""Password hashing: argon2id at the configured cost, on a bounded pool of threads.

Every argon2 call of the process (sign-in checks, the dummy check for unknown emails, new and
re-made hashes) runs here, on `threads` threads of its own, each holding one hash's memory
(`memory_kib`) while it works: memory and CPU spent on passwords are bounded by the pool, not
by how many people (or bots) submit a form at once. At most `queue` more calls wait for a
thread; beyond that a call is refused at once with Unavailable (503 + Retry-After), before any
work is done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import TypeVar

from argon2 import PasswordHasher, Type
from argon2.exceptions import InvalidHashError, VerificationError

from bullpen.errors import Unavailable

T = TypeVar("T")

RETRY_AFTER_S = 1.0  # a full queue drains in about this long at the default cost


@dataclass(frozen=True, slots=True)
class HashCost:
    """argon2id parameters of new hashes."""

    memory_kib: int = 19_456  # OWASP's recommended floor: 19 MiB, 2 passes, 1 lane
    time_cost: int = 2
    parallelism: int = 1

    def hasher(self) -> PasswordHasher:
        """An argon2-cffi hasher at this cost."""
        return PasswordHasher(
            time_cost=self.time_cost,
            memory_cost=self.memory_kib,
            parallelism=self.parallelism,
            type=Type.ID,
        )


def verify(hasher: PasswordHasher, stored: str, password: str) -> bool:
    """Whether `password` matches the stored hash (blocking; a malformed hash is no match)."""
    try:
        return hasher.verify(stored, password)
    except (VerificationError, InvalidHashError):
        return False


class PasswordPool:
    """Hashes and checks passwords on its own threads; refuses work beyond its queue."""

    def __init__(self, cost: HashCost, *, threads: int, queue: int) -> None:
        if threads < 1 or queue < 0:
            raise ValueError("threads must be >= 1 and queue >= 0")
        self.cost = cost
        self._hasher = cost.hasher()
        self._limit = threads + queue
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="argon2")
        self.held = 0  # calls running or waiting for a thread
        self.verified = 0  # password checks done (tests and metrics read it)

    def __enter__(self) -> PasswordPool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Drop waiting calls; a running one ends on its own (a fraction of a second)."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    @property
    def full(self) -> bool:
        """Whether a call now would be refused."""
        return self.held >= self._limit

    def admit(self) -> None:
        """Refuse (Unavailable) now, before other work, if a call would be refused."""
        if self.full:
            raise Unavailable(
                "too many passwords are being checked right now; retry shortly",
                retry_after=RETRY_AFTER_S,
            )

    async def verify(self, stored: str, password: str) -> bool:
        """Whether `password` matches `stored`; Unavailable when the pool is full."""
        ok = await self._run(verify, self._hasher, stored, password)
        self.verified += 1
        return ok

    async def hash(self, password: str) -> str:
        """A new hash of `password` at the configured cost; Unavailable when the pool is full."""
        return await self._run(self._hasher.hash, password)

    def needs_rehash(self, stored: str) -> bool:
        """Whether a stored hash was made other than at the configured cost (or not argon2id)."""
        try:
            return self._hasher.check_needs_rehash(stored)
        except (InvalidHashError, ValueError):
            return True

    def hash_now(self, password: str) -> str:
        """A hash at the configured cost, on the caller's thread (for start-up, not requests)."""
        return self._hasher.hash(password)

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        self.admit()
        self.held += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        finally:
            self.held -= 1
