"""In-process rate limits: token buckets per key (GCRA), a failed-sign-in counter, and relay
keys' requests and tokens per minute (sliding windows).

Limits are per process (documented): with several API processes, each enforces its own share.
State is bounded: buckets that have refilled completely carry no information and are dropped.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from bullpen.errors import KeyRateLimited, RateLimited, Unavailable

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


class _KeyWindow:
    """One key's last minute: its calls' start times, its ended calls' tokens, and the prompt
    estimates of its calls still in flight."""

    __slots__ = ("inflight", "requests", "tokens", "tokens_sum", "touched")

    def __init__(self) -> None:
        self.requests: deque[float] = deque()
        self.tokens: deque[tuple[float, int]] = deque()
        self.tokens_sum = 0
        self.inflight = 0
        self.touched = 0.0

    def prune(self, since: float) -> None:
        while self.requests and self.requests[0] <= since:
            self.requests.popleft()
        while self.tokens and self.tokens[0][0] <= since:
            self.tokens_sum -= self.tokens.popleft()[1]

    def empty(self) -> bool:
        return not self.requests and not self.tokens and self.inflight == 0


class KeyTicket:
    """What `KeyWindows.admit` counted for one call; given back to `KeyWindows.settle`."""

    __slots__ = ("estimate", "key", "tpm")

    def __init__(self, key: str, estimate: int, tpm: bool) -> None:
        self.key = key
        self.estimate = estimate
        self.tpm = tpm


class KeyWindows:
    """Relay keys' requests per minute and tokens per minute, over a sliding minute.

    Exact within this process (the check and the count happen with no await between them);
    each API process keeps its own windows. A request counts when it is admitted; its tokens
    count as its prompt estimate while it is in flight, then as the input plus output tokens
    its usage reports, at the moment it ends. A call is refused when the minute already holds
    `rpm` requests, or when its prompt estimate would take the minute's tokens past `tpm`
    (unless the minute holds none: one call larger than the limit may still go alone).
    """

    def __init__(self, *, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self._window = window_s
        self._clock = clock
        self._keys: OrderedDict[str, _KeyWindow] = OrderedDict()  # least recently used first

    def admit(
        self, key: str, *, rpm: int | None, tpm: int | None, estimate: int
    ) -> KeyTicket | None:
        """Count a call of `key`, or raise KeyRateLimited with the wait; None if no limit."""
        if rpm is None and tpm is None:
            return None
        now = self._clock()
        since = now - self._window
        self._forget(since)
        window = self._keys.get(key)
        if window is None:
            window = self._keys[key] = _KeyWindow()
        else:
            self._keys.move_to_end(key)
            window.prune(since)
        window.touched = now
        if rpm is not None and len(window.requests) >= rpm:
            wait = window.requests[-rpm] + self._window - now
            raise KeyRateLimited(
                f"this API key's limit of {rpm} requests per minute is reached; "
                f"retry in {math.ceil(wait)} s",
                kind="requests",
                retry_after=float(max(1, math.ceil(wait))),
            )
        if tpm is not None:
            used = window.tokens_sum + window.inflight
            if used and used + estimate > tpm:
                wait = self._tokens_free_in(window, tpm - estimate, now)
                raise KeyRateLimited(
                    f"this API key's limit of {tpm} tokens per minute is reached ({used} used "
                    f"in the last minute, about {estimate} asked); retry in {math.ceil(wait)} s",
                    kind="tokens",
                    retry_after=float(max(1, math.ceil(wait))),
                )
            window.inflight += estimate
        if rpm is not None:
            window.requests.append(now)
        return KeyTicket(key, estimate if tpm is not None else 0, tpm is not None)

    def settle(self, ticket: KeyTicket | None, tokens: int) -> None:
        """The call ended having used `tokens` (input + output): they count from now."""
        if ticket is None:
            return
        window = self._keys.get(ticket.key)
        if window is None:
            return
        window.inflight -= ticket.estimate
        if ticket.tpm and tokens > 0:
            now = self._clock()
            window.tokens.append((now, tokens))
            window.tokens_sum += tokens
            window.touched = now

    def _tokens_free_in(self, window: _KeyWindow, room: int, now: float) -> float:
        """Seconds until the minute's tokens fit in `room` (1 if only calls in flight hold it)."""
        used = window.tokens_sum + window.inflight
        for ended, tokens in window.tokens:
            used -= tokens
            if used <= room or used == 0:
                return ended + self._window - now
        return 1.0

    def _forget(self, since: float) -> None:
        """Drop keys whose last minute is over (least recently used first)."""
        while self._keys:
            key, window = next(iter(self._keys.items()))
            if len(self._keys) <= _MAX_KEYS and (window.touched > since or window.inflight):
                return
            del self._keys[key]
