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
from bullpen.gateway.client import StreamResult, _parse
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
    for raw in (
        {},
        {"provider": "p"},
        {"provider": 1, "model": "m"},
        {"provider": "p", "model": "m", "max_tokens": 0},
    ):
        with pytest.raises(BullpenError):
            LlmConfig.parse(raw)


def test_stream_lines_are_parsed_like_openai_sends_them() -> None:
    result = StreamResult()
    assert _parse(b": comment\n", result) is None
    assert _parse(b"data: [DONE]\n", result) is None
    role = b'data: {"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}'
    assert _parse(role, result) is None and result.model == "m"
    assert _parse(b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n', result) == "Hi"
    assert _parse(b'data:{"choices":[{"delta":{},"finish_reason":"stop"}]}', result) is None
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}'
    assert _parse(usage, result) is None
    assert (result.finish_reason, result.input_tokens, result.output_tokens) == ("stop", 3, 4)
    with pytest.raises(ProviderError, match="malformed"):
        _parse(b"data: {oops", result)
    with pytest.raises(ProviderError, match="overloaded"):
        _parse(b'data: {"error":{"message":"overloaded"}}', result)
