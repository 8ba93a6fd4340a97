"""Token buckets and the failed-sign-in window, on a controlled clock."""

from __future__ import annotations

import pytest

from bullpen.errors import KeyRateLimited, RateLimited
from bullpen.security.ratelimit import CallerLimits, FailureWindow, KeyWindows, TokenBuckets


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


def test_key_requests_per_minute_slide_and_say_when_to_retry() -> None:
    clock = Clock()
    windows = KeyWindows(clock=clock)
    for step in range(3):
        windows.settle(windows.admit("k", rpm=3, tpm=None, estimate=0), 0)
        clock.now += 10.0 * (step + 1)  # calls at 0, 10 and 30 s
    clock.now = 1000.0 + 45.0
    with pytest.raises(KeyRateLimited) as refused:
        windows.admit("k", rpm=3, tpm=None, estimate=0)
    assert refused.value.kind == "requests" and refused.value.retry_after == 15.0
    assert windows.admit("other", rpm=3, tpm=None, estimate=0) is not None  # its own window
    assert windows.admit("free", rpm=None, tpm=None, estimate=10**9) is None
    clock.now = 1000.0 + 60.0  # the first call leaves the minute
    windows.admit("k", rpm=3, tpm=None, estimate=0)
    with pytest.raises(KeyRateLimited):
        windows.admit("k", rpm=3, tpm=None, estimate=0)


def test_key_tokens_per_minute_count_prompts_in_flight_then_the_reported_usage() -> None:
    clock = Clock()
    windows = KeyWindows(clock=clock)
    first = windows.admit("k", rpm=None, tpm=100, estimate=40)
    second = windows.admit("k", rpm=None, tpm=100, estimate=40)  # 40 in flight + 40 <= 100
    with pytest.raises(KeyRateLimited) as refused:  # 80 in flight + 40 > 100
        windows.admit("k", rpm=None, tpm=100, estimate=40)
    assert refused.value.kind == "tokens" and refused.value.retry_after == 1.0
    clock.now += 5.0
    windows.settle(first, 70)  # its usage: 70 tokens, counted from now (1005 s)
    clock.now += 5.0
    windows.settle(second, 0)  # failed before any usage: frees its estimate
    windows.admit("k", rpm=None, tpm=100, estimate=30)  # 70 + 30
    with pytest.raises(KeyRateLimited) as refused:
        windows.admit("k", rpm=None, tpm=100, estimate=1)
    # The 70 leave the minute at 1065 s; the 30 in flight stay until their call ends.
    assert refused.value.retry_after == 55.0
    clock.now = 1065.0
    windows.admit("k", rpm=None, tpm=100, estimate=70)


def test_a_call_larger_than_the_key_tpm_may_go_alone_and_idle_keys_are_forgotten() -> None:
    clock = Clock()
    windows = KeyWindows(clock=clock)
    ticket = windows.admit("k", rpm=2, tpm=10, estimate=500)
    windows.settle(ticket, 600)
    with pytest.raises(KeyRateLimited):
        windows.admit("k", rpm=2, tpm=10, estimate=1)
    clock.now += 61.0
    windows.admit("other", rpm=1, tpm=None, estimate=0)
    assert "k" not in windows._keys  # its minute is over: nothing kept for it
