"""Scripted turns for the simulated provider: make a simulated model call tools.

A system (or developer) message may carry a script between `<sim-script>` and `</sim-script>`:
a JSON list of turns. The simulator answers a conversation with turn N, where N is the number
of assistant messages already in it; past the last turn it answers with its usual filler text.
A turn is either `{"text": "..."}` or `{"tool_calls": [{"name": "...", "arguments": {...}}]}`.
In a turn's strings, `{{context}}` is replaced by the content of the conversation's last user
message (where an agent's run finds what its subtasks ended with).

This is how tests and the workflow benchmark script a team of agents without a real model.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

_SCRIPT = re.compile(r"<sim-script>(.*?)</sim-script>", re.DOTALL)
_CONTEXT = "{{context}}"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One function call a scripted turn makes."""

    name: str
    arguments: str  # JSON, as OpenAI sends it


@dataclass(frozen=True, slots=True)
class Turn:
    """What the simulated model answers: text, or tool calls."""

    text: str | None
    tool_calls: tuple[ToolCall, ...]


class ScriptError(ValueError):
    """A script that cannot be read (answered as a 400 by the simulator)."""


def _fill(value: Any, context: str) -> Any:
    if isinstance(value, str):
        return value.replace(_CONTEXT, context)
    if isinstance(value, list):
        return [_fill(item, context) for item in value]
    if isinstance(value, dict):
        return {key: _fill(item, context) for key, item in value.items()}
    return value


def _turn(raw: object, context: str) -> Turn:
    if not isinstance(raw, dict):
        raise ScriptError("each sim-script turn must be an object")
    if isinstance(raw.get("text"), str):
        return Turn(_fill(raw["text"], context), ())
    calls = raw.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        raise ScriptError("a sim-script turn needs 'text' or a non-empty 'tool_calls' list")
    out = []
    for call in calls:
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise ScriptError("each sim-script tool call needs a 'name'")
        arguments = _fill(call.get("arguments", {}), context)
        out.append(ToolCall(call["name"], orjson.dumps(arguments).decode()))
    return Turn(None, tuple(out))


def scripted_turn(messages: Sequence[Mapping[str, Any]]) -> Turn | None:
    """The scripted answer to `messages`, or None (no script, or the script has ended)."""
    script: list[object] | None = None
    for message in messages:
        content = message.get("content")
        if message.get("role") in ("system", "developer") and isinstance(content, str):
            found = _SCRIPT.search(content)
            if found is not None:
                try:
                    parsed = orjson.loads(found.group(1))
                except orjson.JSONDecodeError as exc:
                    raise ScriptError(f"sim-script is not JSON: {exc}") from exc
                if not isinstance(parsed, list):
                    raise ScriptError("sim-script must be a JSON list of turns")
                script = parsed
                break
    if script is None:
        return None
    index = sum(1 for message in messages if message.get("role") == "assistant")
    if index >= len(script):
        return None
    context = next(
        (
            str(message.get("content") or "")
            for message in reversed(messages)
            if message.get("role") == "user"
        ),
        "",
    )
    return _turn(script[index], context)
