"""Pure rules: the state machine, bearer tokens, cursors, titles, agent config, stream parsing."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from bullpen.agents.llm import LlmConfig
from bullpen.api import cursor
from bullpen.domain import tokens
from bullpen.domain.status import (
    TERMINAL_RUN,
    TERMINAL_TASK,
    RunStatus,
    TaskStatus,
    run_can_move,
    run_sources,
    task_can_move,
    task_sources,
)
from bullpen.errors import BullpenError, InvalidInput, ProviderError
from bullpen.gateway.catalog import Provider, Timeouts
from bullpen.gateway.client import Exchange, _Lines
from bullpen.services.tasks import TITLE_CHARS, title_from_prompt


def test_terminal_runs_never_move_and_done_tasks_stay_done() -> None:
    for status in TERMINAL_RUN:
        assert not any(run_can_move(status, dst) for dst in RunStatus)
    assert not any(task_can_move(TaskStatus.DONE, dst) for dst in TaskStatus)
    assert TaskStatus.DONE in TERMINAL_TASK and TaskStatus.RUNNING not in TERMINAL_TASK


def test_the_skeleton_path_is_allowed() -> None:
    assert task_can_move(TaskStatus.QUEUED, TaskStatus.RUNNING)
    assert task_can_move(TaskStatus.RUNNING, TaskStatus.DONE)
    assert run_can_move(RunStatus.QUEUED, RunStatus.RUNNING)
    assert run_can_move(RunStatus.RUNNING, RunStatus.QUEUED)  # a lost lease is re-queued
    assert not run_can_move(RunStatus.QUEUED, RunStatus.DONE)


def test_sources_invert_the_moves() -> None:
    assert run_sources(RunStatus.DONE) == {RunStatus.RUNNING}
    assert TaskStatus.QUEUED in task_sources(TaskStatus.RUNNING)
    assert TaskStatus.DONE not in task_sources(TaskStatus.QUEUED)


def test_api_keys_are_long_random_and_prefixed() -> None:
    keys = {tokens.new_api_key() for _ in range(100)}
    assert len(keys) == 100
    for key in keys:
        assert key.startswith("bp_") and len(key) >= 3 + 43  # 256 bits in base64url
        assert tokens.looks_like_api_key(key)
        assert tokens.visible_prefix(key) == key[:11]
    assert not tokens.looks_like_api_key("bp_short")
    assert not tokens.looks_like_api_key("sk-" + "x" * 40)


def test_digests_depend_on_secret_and_token() -> None:
    key = tokens.new_api_key()
    a = tokens.digest(b"a" * 32, key)
    assert len(a) == 32
    assert a == tokens.digest(b"a" * 32, key)
    assert a != tokens.digest(b"b" * 32, key)
    assert a != tokens.digest(b"a" * 32, key + "x")
    assert tokens.digest(b"a" * 32, "\udcff")  # lone surrogates from headers do not crash


def test_cursor_round_trips_and_rejects_garbage() -> None:
    when, row = datetime(2026, 5, 1, 12, 0, 0, 123456, tzinfo=UTC), uuid.uuid4()
    assert cursor.decode(cursor.encode(when, row)) == (when, row)
    for bad in ("", "%%%", "Zm9v", cursor.encode(when, row)[:-4]):
        with pytest.raises(InvalidInput):
            cursor.decode(bad)


def test_titles_come_from_the_first_line() -> None:
    assert title_from_prompt("  Analyze this\nand that") == "Analyze this"
    long = title_from_prompt("x" * 500)
    assert len(long) == TITLE_CHARS and long.endswith("…")


def test_llm_config_is_checked() -> None:
    config = LlmConfig.parse({"provider": "p", "model": "m", "max_tokens": 5})
    assert (config.provider, config.model, config.max_tokens) == ("p", "m", 5)
    assert LlmConfig.parse({"model": "smart"}).provider is None
    for raw in (
        {},
        {"provider": "p"},
        {"provider": 1, "model": "m"},
        {"provider": "p", "model": "m", "max_tokens": 0},
    ):
        with pytest.raises(BullpenError):
            LlmConfig.parse(raw)


def test_stream_lines_are_parsed_like_openai_sends_them() -> None:
    provider = Provider("k", "p", "http://x", Timeouts(1, 1, 1, 1), api_key="sk-secret-key-123")
    exchange = Exchange()
    lines = _Lines(provider, exchange)
    role = b'data: {"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}'
    # Split across reads mid-line: nothing is parsed until the line is complete.
    assert lines.feed(b": comment\n" + role[:20]) == []
    assert lines.feed(role[20:] + b"\n\n") == [] and exchange.model == "m"
    assert not lines.saw_content
    [hi] = lines.feed(b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\n')
    assert hi["choices"][0]["delta"]["content"] == "Hi" and lines.saw_content
    assert exchange.content_chunks == 1
    [finish] = lines.feed(b'data:{"choices":[{"delta":{},"finish_reason":"stop"}]}\n')
    assert finish["choices"][0]["finish_reason"] == "stop"
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,'
    usage += b'"prompt_tokens_details":{"cached_tokens":2}}}\n'
    assert len(lines.feed(usage + b"data: [DONE]\n")) == 1 and lines.ended
    assert (exchange.finish_reason, exchange.input_tokens, exchange.output_tokens) == (
        "stop",
        3,
        4,
    )
    assert exchange.cached_input_tokens == 2
    bad = _Lines(provider, Exchange())
    assert bad.feed(b"data: {oops\n") == [] and bad.ended
    with pytest.raises(ProviderError, match="malformed"):
        bad.raise_pending()
    # Content before an error in the same read is handed on first; the error comes after.
    failing = _Lines(provider, Exchange())
    content = b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n'
    [before] = failing.feed(content + b'data: {"error":{"message":"overloaded"}}\n' + content)
    assert before["choices"][0]["delta"]["content"] == "Hi"
    with pytest.raises(ProviderError, match="overloaded") as err:
        failing.raise_pending()
    assert err.value.transient and err.value.reason == "stream-error"
    echoed = _Lines(provider, Exchange())
    echoed.feed(b'data: {"error":{"message":"sk-secret-key-123"}}\n')
    assert echoed.error is not None and "sk-secret-key-123" not in echoed.error.detail
