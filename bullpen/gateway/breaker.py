"""Per-provider circuit breakers: skip a failing provider for a cooldown, then probe it."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum


class BreakerState(IntEnum):
    """Exported as a gauge: 0 closed, 1 half-open, 2 open."""

    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    """Open after `failures` within `window_s`; stay open `cooldown_s`; then one probe at a time."""

    failures: int = 5
    window_s: float = 30.0
    cooldown_s: float = 30.0


@dataclass(frozen=True, slots=True)
class BreakerView:
    """A breaker as this process sees it now: its state, for how many seconds it has been in
    it, the failures counted towards opening (closed), and whether a probe is in flight."""

    state: BreakerState
    for_s: float
    failures: int
    probing: bool


class Breaker:
    """One provider's breaker. Not thread-safe: each event loop keeps its own."""

    __slots__ = ("_clock", "_closed_at", "_failures", "_opened_at", "_policy", "_probing")

    def __init__(self, policy: BreakerPolicy, clock: Callable[[], float]) -> None:
        self._policy = policy
        self._clock = clock
        self._failures: deque[float] = deque()
        self._opened_at: float | None = None
        self._closed_at = clock()  # made closed, on first use
        self._probing = False

    @property
    def state(self) -> BreakerState:
        """Closed, open (cooling down) or half-open (cooled down, waiting for a probe)."""
        if self._opened_at is None:
            return BreakerState.CLOSED
        if self._clock() - self._opened_at < self._policy.cooldown_s:
            return BreakerState.OPEN
        return BreakerState.HALF_OPEN

    def allow(self) -> bool:
        """Whether a request may go to the provider now; a half-open breaker lets one through."""
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.OPEN or self._probing:
            return False
        self._probing = True
        return True

    def view(self) -> BreakerView:
        """The state and since when (as seconds ago), for people to read."""
        now = self._clock()
        state = self.state
        if state is BreakerState.CLOSED:
            window = self._policy.window_s
            recent = sum(1 for t in self._failures if now - t <= window)
            return BreakerView(state, now - self._closed_at, recent, False)
        assert self._opened_at is not None
        since = self._opened_at
        if state is BreakerState.HALF_OPEN:
            since += self._policy.cooldown_s
        return BreakerView(state, now - since, 0, self._probing)

    def succeeded(self) -> None:
        """A request was served: close."""
        if self._opened_at is not None:
            self._closed_at = self._clock()
        self._failures.clear()
        self._opened_at = None
        self._probing = False

    def failed(self) -> None:
        """A request failed on the provider's side: count it, and open at the threshold."""
        now = self._clock()
        if self._probing or self._opened_at is not None:
            self._opened_at = now  # the probe failed: another full cooldown
            self._probing = False
            return
        failures = self._failures
        failures.append(now)
        while failures and now - failures[0] > self._policy.window_s:
            failures.popleft()
        if len(failures) >= self._policy.failures:
            failures.clear()
            self._opened_at = now

    def abandoned(self) -> None:
        """A probe ended without a verdict (cancelled, or refused by the caller's own error)."""
        self._probing = False


class Breakers:
    """The breakers of every provider this process has called, by provider key."""

    def __init__(self, policy: BreakerPolicy, clock: Callable[[], float] = time.monotonic) -> None:
        self._policy = policy
        self._clock = clock
        self._by_key: dict[str, tuple[str, Breaker]] = {}

    def get(self, key: str, name: str) -> Breaker:
        """The breaker for a provider, made on first use."""
        found = self._by_key.get(key)
        if found is None:
            found = (name, Breaker(self._policy, self._clock))
            self._by_key[key] = found
        return found[1]

    def view(self, key: str) -> BreakerView | None:
        """A provider's breaker as this process sees it; None if it never called the provider."""
        found = self._by_key.get(key)
        return None if found is None else found[1].view()

    @property
    def policy(self) -> BreakerPolicy:
        """When breakers open and for how long."""
        return self._policy

    def states(self) -> list[tuple[str, str, BreakerState]]:
        """(provider key, provider name, state) for the metrics."""
        return [(key, name, b.state) for key, (name, b) in self._by_key.items()]
