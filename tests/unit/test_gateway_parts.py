"""The gateway's pure parts: breaker, redaction, prices, route resolution, secrets at rest."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from bullpen.errors import BullpenError, ModelNotFound
from bullpen.gateway.breaker import Breaker, BreakerPolicy, Breakers, BreakerState
from bullpen.gateway.catalog import Catalog, Price, Provider, Target, Timeouts
from bullpen.gateway.redact import MASK, ChunkRedactor, Redactor, scrub
from bullpen.security.secrets import SecretBox, hint
from bullpen.services.gateway import origin

LIMITS = Timeouts(connect_s=1, ttft_s=1, idle_s=1, deadline_s=10)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_breaker_opens_after_failures_in_the_window_then_probes_once() -> None:
    clock = Clock()
    breaker = Breaker(BreakerPolicy(failures=3, window_s=10, cooldown_s=5), clock)
    breaker.failed()
    clock.now += 11  # the first failure leaves the window
    breaker.failed()
    breaker.failed()
    assert breaker.state is BreakerState.CLOSED and breaker.allow()
    breaker.failed()
    assert breaker.state is BreakerState.OPEN and not breaker.allow()
    clock.now += 5
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.allow()  # the probe
    assert not breaker.allow()  # only one at a time
    breaker.failed()  # the probe failed: a whole new cooldown
    assert breaker.state is BreakerState.OPEN
    clock.now += 5
    assert breaker.allow()
    breaker.succeeded()
    assert breaker.state is BreakerState.CLOSED and breaker.allow()


def test_an_abandoned_probe_lets_the_next_one_through() -> None:
    clock = Clock()
    breaker = Breaker(BreakerPolicy(failures=1, window_s=10, cooldown_s=1), clock)
    breaker.failed()
    clock.now += 1
    assert breaker.allow() and not breaker.allow()
    breaker.abandoned()
    assert breaker.allow()


def test_breakers_are_kept_per_provider_key() -> None:
    breakers = Breakers(BreakerPolicy(failures=1), Clock())
    breakers.get("a", "alpha").failed()
    assert not breakers.get("a", "alpha").allow()
    assert breakers.get("b", "alpha").allow()
    states = {key: state for key, _name, state in breakers.states()}
    assert states == {"a": BreakerState.OPEN, "b": BreakerState.CLOSED}


SECRET = "sk-live-0123456789abcdef"


def _stream(pieces: list[str]) -> str:
    redactor = Redactor([SECRET])
    return "".join(redactor.feed(p) for p in pieces) + redactor.flush()


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 11, 100])
def test_a_key_split_across_pieces_never_gets_through(size: int) -> None:
    text = f'{{"Authorization": "Bearer {SECRET}", "again": "{SECRET}"}} tail'
    pieces = [text[i : i + size] for i in range(0, len(text), size)]
    out = _stream(pieces)
    assert SECRET not in out
    assert out == text.replace(SECRET, MASK)


def test_text_that_cannot_start_the_key_is_never_held_back() -> None:
    redactor = Redactor([SECRET])
    for word in ["Hello", " world", ", the", " sky is blue"]:
        assert redactor.feed(word) == word
    assert redactor.feed(", the s") == ", the "  # one letter held for one piece
    assert redactor.feed("ea") == "sea"
    assert redactor.feed("ends with sk-li") == "ends with "  # could start the key: held
    assert redactor.feed("ke a fish") == "sk-like a fish"
    assert redactor.flush() == ""


def test_a_held_prefix_is_released_at_the_end() -> None:
    redactor = Redactor([SECRET])
    assert redactor.feed("almost sk-live-01") == "almost "
    assert redactor.flush() == "sk-live-01"


def test_scrub_masks_whole_occurrences() -> None:
    assert scrub(f"bad key {SECRET}.", [SECRET]) == f"bad key {MASK}."
    assert scrub("nothing here", [SECRET, ""]) == "nothing here"


def _tool_chunk(index: int, arguments: str, finish: str | None = None) -> dict[str, Any]:
    call = {"index": index, "function": {"arguments": arguments}}
    return {"choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": finish}]}


def _arguments(chunks: list[dict[str, Any]]) -> dict[int, str]:
    whole: dict[int, str] = {}
    for chunk in chunks:
        deltas = [choice.get("delta", {}) for choice in chunk["choices"]]
        for call in (c for delta in deltas for c in delta.get("tool_calls") or ()):
            index = call["index"]
            whole[index] = whole.get(index, "") + call["function"].get("arguments", "")
    return whole


# Issue 19, finding 11c: each tool call's arguments are a text of their own, however their
# pieces interleave across chunks.
@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 11, 100])
def test_a_key_split_across_tool_call_chunks_never_gets_through(size: int) -> None:
    texts = {0: f'{{"note": "{SECRET}", "x": 1}}', 1: f'{{"key": "Bearer {SECRET}"}}'}
    pieces = {i: [t[j : j + size] for j in range(0, len(t), size)] for i, t in texts.items()}
    chunks = []
    for k in range(max(len(p) for p in pieces.values())):  # the two calls interleaved
        chunks.extend(_tool_chunk(i, p[k]) for i, p in pieces.items() if k < len(p))
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    chunks.append({"choices": [], "usage": {"prompt_tokens": 1}})
    redactor = ChunkRedactor([SECRET])
    for chunk in chunks:
        redactor.chunk(chunk)
    assert _arguments(chunks) == {i: t.replace(SECRET, MASK) for i, t in texts.items()}


def test_what_tool_call_chunks_held_back_comes_out_with_the_finish() -> None:
    redactor = ChunkRedactor([SECRET])
    first = _tool_chunk(0, '{"a": "sk-li')
    redactor.chunk(first)
    assert first["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] == '{"a": "'
    content = {"choices": [{"index": 0, "delta": {"content": "so sk-"}, "finish_reason": None}]}
    redactor.chunk(content)
    assert content["choices"][0]["delta"]["content"] == "so "
    last = _tool_chunk(0, 'ke"}', finish="stop")
    redactor.chunk(last)
    delta = last["choices"][0]["delta"]
    assert delta["tool_calls"][0]["function"]["arguments"] == 'sk-like"}'
    assert delta["content"] == "sk-"
    bare = ChunkRedactor([SECRET])
    bare.chunk(_tool_chunk(2, "sk-live"))
    ending: dict[str, Any] = {"choices": [{"index": 0, "finish_reason": "tool_calls"}]}
    bare.chunk(ending)
    assert ending["choices"][0]["delta"] == {
        "tool_calls": [{"index": 2, "function": {"arguments": "sk-live"}}]
    }


def test_price_counts_cached_input_apart() -> None:
    price = Price(input=2.0, cached_input=0.5, output=8.0)
    assert price.cost(1_000_000, 0, 0) == pytest.approx(2.0)
    assert price.cost(1000, 400, 500) == pytest.approx((600 * 2 + 400 * 0.5 + 500 * 8) / 1e6)


def _provider(name: str, *models: str) -> Provider:
    return Provider(
        key=name,
        name=name,
        base_url="http://x/v1",
        timeouts=LIMITS,
        prices=dict.fromkeys(models, Price()),
    )


def test_a_model_name_resolves_to_a_route_a_direct_pick_or_a_single_owner() -> None:
    a, b = _provider("a", "m1", "shared"), _provider("b", "m2", "shared", "org/m3")
    catalog = Catalog(
        providers={"a": a, "b": b},
        routes={"smart": (Target(a, "m1"), Target(b, "m2"))},
    )
    assert [(t.provider.name, t.model) for t in catalog.resolve("smart")] == [
        ("a", "m1"),
        ("b", "m2"),
    ]
    assert catalog.resolve("b/org/m3") == (Target(b, "org/m3"),)
    assert catalog.resolve("m1") == (Target(a, "m1"),)
    assert catalog.resolve("m2", provider="b") == (Target(b, "m2"),)
    with pytest.raises(ModelNotFound, match="several providers"):
        catalog.resolve("shared")
    with pytest.raises(ModelNotFound, match="no model route"):
        catalog.resolve("nope")
    with pytest.raises(ModelNotFound, match="has no model"):
        catalog.resolve("a/m2")
    with pytest.raises(ModelNotFound, match="not configured"):
        catalog.resolve("m1", provider="c")
    assert catalog.model_ids() == ["smart", "a/m1", "a/shared", "b/m2", "b/org/m3", "b/shared"]


def test_sealed_secrets_open_only_with_the_same_key_and_context() -> None:
    box = SecretBox(b"k" * 40)
    sealed = box.seal(SECRET, b"provider:1")
    assert SECRET.encode() not in sealed
    assert base64.b64encode(SECRET.encode()) not in sealed
    assert box.open(sealed, b"provider:1") == SECRET
    assert box.seal(SECRET, b"provider:1") != sealed  # a fresh nonce every time
    with pytest.raises(BullpenError, match="does not open"):
        box.open(sealed, b"provider:2")  # copied onto another row
    with pytest.raises(BullpenError, match="does not open"):
        SecretBox(b"j" * 40).open(sealed, b"provider:1")
    with pytest.raises(BullpenError, match="unknown format"):
        box.open(b"\x02" + sealed[1:], b"provider:1")


def test_a_hint_shows_little_of_the_key() -> None:
    assert hint(SECRET) == "sk-…cdef"
    assert hint("short-key") == "…ey"


def test_an_origin_is_scheme_host_and_port_as_requests_reach_them() -> None:
    """A provider's key stays with its origin (issue 19, finding 2): what counts as one."""
    assert origin("https://api.example.com/v1") == ("https", "api.example.com", 443)
    assert origin("https://API.Example.com:443/v2") == origin("https://api.example.com/v1")
    assert origin("http://api.example.com:80") == origin("HTTP://api.example.com/other")
    for moved in (
        "http://api.example.com/v1",  # scheme
        "https://api.example.com:8443/v1",  # port
        "https://api.example.com.evil.test/v1",  # host
        "https://api.example.com./v1",  # a trailing dot is another name as written
        "https://[::1]/v1",
    ):
        assert origin(moved) != origin("https://api.example.com/v1"), moved
