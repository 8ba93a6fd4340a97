"""Token buckets and the failed-sign-in window, on a controlled clock."""

from __future__ import annotations

import pytest

from bullpen.errors import RateLimited
from bullpen.security.ratelimit import CallerLimits, FailureWindow, TokenBuckets


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_allows_its_burst_then_refills_at_its_rate() -> None:
    clock = Clock()
    buckets = TokenBuckets(rate=2.0, burst=3, what="k", clock=clock)
    for _ in range(3):
        buckets.take("a")
    with pytest.raises(RateLimited) as refused:
        buckets.take("a")
    assert refused.value.retry_after == pytest.approx(0.5)
    buckets.take("b")  # another key has its own bucket
    clock.now += 0.5
    buckets.take("a")
    with pytest.raises(RateLimited):
        buckets.take("a")
    clock.now += 10
    for _ in range(3):
        buckets.take("a")  # refilled to the burst, not beyond
    with pytest.raises(RateLimited):
        buckets.take("a")


def test_refilled_buckets_are_forgotten() -> None:
    clock = Clock()
    buckets = TokenBuckets(rate=100.0, burst=1, what="k", clock=clock)
    for n in range(1000):
        buckets.take(f"key-{n}")
        clock.now += 0.02
    assert len(buckets._tat) <= 2


def test_caller_limits_check_the_caller_and_the_workspace() -> None:
    clock = Clock()
    limits = CallerLimits(
        TokenBuckets(rate=1, burst=2, what="caller", clock=clock),
        TokenBuckets(rate=1, burst=3, what="workspace", clock=clock),
    )
    limits.take("key:1", "ws")
    limits.take("key:1", "ws")
    with pytest.raises(RateLimited, match="caller"):
        limits.take("key:1", "ws")
    limits.take("key:2", "ws")
    with pytest.raises(RateLimited, match="workspace"):
        limits.take("key:3", "ws")


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError):
        TokenBuckets(rate=0, burst=1, what="k")
    with pytest.raises(ValueError):
        TokenBuckets(rate=1, burst=0, what="k")


def test_failures_lock_out_until_the_window_passes() -> None:
    clock = Clock()
    window = FailureWindow(limit=3, window_s=60, clock=clock)
    for _ in range(3):
        window.check("e")
        window.fail("e")
        clock.now += 1
    with pytest.raises(RateLimited) as refused:
        window.check("e")
    assert refused.value.retry_after == pytest.approx(57)
    window.check("other")
    clock.now += 57.5
    window.check("e")  # the oldest failure left the window
    window.fail("e")
    with pytest.raises(RateLimited):
        window.check("e")
    window.reset("e")
    window.check("e")


def test_pending_attempts_count_until_released() -> None:
    clock = Clock()
    window = FailureWindow(limit=3, window_s=60, clock=clock)
    for _ in range(3):
        window.take("e")  # three at once, none answered yet
    with pytest.raises(RateLimited) as refused:
        window.take("e")
    # Pending ones count as failures made now: the worst case, a whole window.
    assert refused.value.retry_after == pytest.approx(60)
    window.take("other")  # per key

    window.fail("e")
    window.release("e")  # one failed: still three counted
    with pytest.raises(RateLimited):
        window.take("e")
    window.reset("e")  # another succeeded: the failure goes, the two pending ones stay
    window.take("e")
    with pytest.raises(RateLimited):
        window.take("e")
    for _ in range(3):
        window.release("e")  # refunded: nothing recorded
    assert window._pending == {"other": 1}
    window.check("e")
