"""In-process rate limits: token buckets per key (GCRA) and a failed-sign-in counter.

Limits are per process (documented): with several API processes, each enforces its own share.
State is bounded: buckets that have refilled completely carry no information and are dropped.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from bullpen.errors import RateLimited, Unavailable

_MAX_KEYS = 100_000


class TokenBuckets:
    """`rate` requests per second with bursts of `burst`, per key (GCRA: one float per key)."""

    def __init__(
        self, *, rate: float, burst: int, what: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self._interval = 1.0 / rate
        self._tolerance = self._interval * (burst - 1)
        self._tat: OrderedDict[str, float] = OrderedDict()  # theoretical arrival time per key
        self._what = what
        self._clock = clock

    def take(self, key: str) -> None:
        """Spend one token of `key`'s bucket, or raise RateLimited with the wait."""
        now = self._clock()
        tat = max(self._tat.get(key, now), now)
        wait = tat - self._tolerance - now
        if wait > 0:
            raise RateLimited(f"rate limit of {self._what} exceeded", retry_after=wait)
        self._tat[key] = tat + self._interval
        self._tat.move_to_end(key)
        self._trim(now)

    def _trim(self, now: float) -> None:
        while self._tat:
            oldest_key, oldest_tat = next(iter(self._tat.items()))
            if oldest_tat > now and len(self._tat) <= _MAX_KEYS:
                return
            del self._tat[oldest_key]


class FailureWindow:
    """Counts failures per key over a sliding window; refuses once `limit` is reached.

    An attempt whose outcome is not known yet counts as a failure from the moment it is taken
    (`take`) until it is released: a burst of attempts that arrive together gets `limit` of
    them through, not every one that came before the first failure was recorded.
    """

    def __init__(
        self, *, limit: int, window_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._limit = limit
        self._window = window_s
        self._failures: OrderedDict[str, list[float]] = OrderedDict()
        self._pending: dict[str, int] = {}  # attempts taken, not yet released
        self._clock = clock

    def check(self, key: str) -> None:
        """Raise RateLimited if `key`'s failures and pending attempts reach `limit`."""
        now = self._clock()
        # Pending attempts are counted as failures made now (the worst case).
        counted = self._recent(key, now) + [now] * self._pending.get(key, 0)
        if len(counted) >= self._limit:
            raise RateLimited(
                "too many failed sign-ins; wait before trying again",
                retry_after=self._window - (now - counted[len(counted) - self._limit]),
            )

    def take(self, key: str) -> None:
        """Check `key`, then count one attempt of it as pending until `release`."""
        self.check(key)
        self._pending[key] = self._pending.get(key, 0) + 1

    def release(self, key: str) -> None:
        """End a pending attempt (after `fail` or `reset` said how it went, or refunded)."""
        left = self._pending.get(key, 0) - 1
        if left > 0:
            self._pending[key] = left
        else:
            self._pending.pop(key, None)

    def fail(self, key: str) -> None:
        """Record one failure of `key`."""
        now = self._clock()
        recent = self._recent(key, now)
        recent.append(now)
        self._failures[key] = recent[-self._limit :]
        self._failures.move_to_end(key)
        while len(self._failures) > _MAX_KEYS:
            self._failures.popitem(last=False)

    def reset(self, key: str) -> None:
        """Forget `key`'s failures (after a successful sign-in); pending attempts still count."""
        self._failures.pop(key, None)

    def _recent(self, key: str, now: float) -> list[float]:
        return [t for t in self._failures.get(key, ()) if t > now - self._window]


class CallerLimits:
    """The API's request limits: one bucket per caller (key or user) and one per workspace."""

    def __init__(self, per_caller: TokenBuckets, per_workspace: TokenBuckets) -> None:
        self._per_caller = per_caller
        self._per_workspace = per_workspace

    def take(self, caller: str, workspace: str) -> None:
        """Spend one request of the caller's and of its workspace's budget."""
        self._per_caller.take(caller)
        self._per_workspace.take(workspace)


class Slots:
    """A bound on things held at once in this process (relay streams): beyond `limit` in all,
    503; beyond its share, a workspace or a caller (key or user) is refused with 429, so that
    one tenant cannot take every slot from the others."""

    def __init__(
        self,
        limit: int,
        what: str,
        *,
        per_workspace: int | None = None,
        per_caller: int | None = None,
    ) -> None:
        self._limit = limit
        self._what = what
        self._per_workspace = per_workspace or limit
        self._per_caller = per_caller or limit
        self._workspaces: dict[str, int] = {}
        self._callers: dict[str, int] = {}
        self.held = 0

    def take(self, workspace: str, caller: str) -> None:
        """Hold one for `caller` of `workspace`, or raise RateLimited (past a share) or
        Unavailable (all held), each to retry in a second."""
        if self._callers.get(caller, 0) >= self._per_caller:
            raise RateLimited(
                f"this key holds its limit of {self._per_caller} {self._what} on this server; "
                "close one or retry shortly",
                retry_after=1.0,
            )
        if self._workspaces.get(workspace, 0) >= self._per_workspace:
            raise RateLimited(
                f"this workspace holds its limit of {self._per_workspace} {self._what} on this "
                "server; close one or retry shortly",
                retry_after=1.0,
            )
        if self.held >= self._limit:
            raise Unavailable(
                f"this server holds its limit of {self._limit} {self._what}; retry shortly",
                retry_after=1.0,
            )
        self._workspaces[workspace] = self._workspaces.get(workspace, 0) + 1
        self._callers[caller] = self._callers.get(caller, 0) + 1
        self.held += 1

    def give_back(self, workspace: str, caller: str) -> None:
        """Release one taken with `take` (the same workspace and caller)."""
        _drop(self._workspaces, workspace)
        _drop(self._callers, caller)
        self.held -= 1


def _drop(counts: dict[str, int], key: str) -> None:
    """One less for `key`; keys at zero are forgotten (the maps stay as small as what is held)."""
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]
