"""A breaker's view for people (the Providers page): its state and since when."""

from __future__ import annotations

from bullpen.gateway.breaker import Breaker, BreakerPolicy, Breakers, BreakerState


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_breaker_says_since_when_it_is_in_its_state() -> None:
    clock = Clock()
    breaker = Breaker(BreakerPolicy(failures=2, window_s=10, cooldown_s=5), clock)
    clock.now += 3
    view = breaker.view()
    assert (view.state, view.for_s, view.failures) == (BreakerState.CLOSED, 3, 0)
    breaker.failed()
    clock.now += 1
    view = breaker.view()
    assert (view.state, view.for_s, view.failures) == (BreakerState.CLOSED, 4, 1)
    breaker.failed()  # opens at 1004
    clock.now += 2
    view = breaker.view()
    assert (view.state, view.for_s, view.probing) == (BreakerState.OPEN, 2, False)
    clock.now += 4  # cooled down at 1009: half-open since then
    view = breaker.view()
    assert (view.state, view.for_s) == (BreakerState.HALF_OPEN, 1)
    assert breaker.allow() and breaker.view().probing
    clock.now += 1
    breaker.succeeded()  # closed again at 1011
    clock.now += 2
    view = breaker.view()
    assert (view.state, view.for_s, view.failures) == (BreakerState.CLOSED, 2, 0)


def test_breakers_view_only_providers_this_process_called() -> None:
    breakers = Breakers(BreakerPolicy(failures=1), Clock())
    assert breakers.view("a") is None
    breakers.get("a", "alpha").failed()
    view = breakers.view("a")
    assert view is not None and view.state is BreakerState.OPEN
    assert breakers.policy.failures == 1
