"""Tool calls put back together from streamed chat completion chunks.

A streamed answer carries its tool calls in pieces, `choices[0].delta.tool_calls[i]`, each
with the `index` of the call it belongs to. OpenAI sends a call's `id` and its whole
`function.name` in its first piece and then only pieces of `function.arguments`, a JSON text
cut anywhere (mid-token, mid-string, between any two characters). Calls may interleave, and
one chunk may carry several pieces of one call. Compatible providers bend this, so the rules
are lenient where OpenAI's own clients are:

- `index` groups the pieces; a missing or non-integer one counts as 0.
- `id`: the last non-empty one wins (it may come late; a resent one changes nothing).
- `function.name`: the last non-empty one wins, never concatenated (some providers resend the
  whole name with every piece, which concatenation would turn into `read_fileread_file`).
- `function.arguments`: every string piece, in order of arrival, joined.
- anything else (a non-dict piece, a non-string field) is ignored.

The agent adapter (`bullpen.agents.llm`) and the relay's non-streaming answer
(`bullpen.api.routes.relay`) both read tool calls through `ToolCalls`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class AssembledCall:
    """One whole tool call: `id` is None when the provider never sent one."""

    index: int
    id: str | None
    name: str
    arguments: str


@dataclass(slots=True)
class _Pieces:
    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class ToolCalls:
    """Collects the tool call pieces of one streamed answer."""

    __slots__ = ("_calls",)

    def __init__(self) -> None:
        self._calls: dict[int, _Pieces] = {}

    def __bool__(self) -> bool:
        return bool(self._calls)

    def add(self, chunk: dict[str, Any]) -> None:
        """Take the tool call pieces of a chunk's first choice, if any."""
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return
        delta = choices[0].get("delta")
        if isinstance(delta, dict):
            self.add_delta(delta)

    def add_delta(self, delta: dict[str, Any]) -> None:
        """Take the tool call pieces of one choice's `delta`."""
        pieces = delta.get("tool_calls")
        if not isinstance(pieces, list):
            return
        for piece in pieces:
            if not isinstance(piece, dict):
                continue
            index = piece.get("index", 0)
            if not isinstance(index, int) or isinstance(index, bool):
                index = 0
            entry = self._calls.get(index)
            if entry is None:
                entry = self._calls[index] = _Pieces()
            call_id = piece.get("id")
            if isinstance(call_id, str) and call_id:
                entry.id = call_id
            function = piece.get("function")
            if isinstance(function, dict):
                name, arguments = function.get("name"), function.get("arguments")
                if isinstance(name, str) and name:
                    entry.name = name
                if isinstance(arguments, str):
                    entry.arguments.append(arguments)

    def calls(self) -> list[AssembledCall]:
        """The calls so far, by index."""
        return [
            AssembledCall(index, entry.id, entry.name, "".join(entry.arguments))
            for index, entry in sorted(self._calls.items())
        ]


# A rough tokenizer for providers that report no usage: about four characters a token.
CHARS_PER_TOKEN = 4


@dataclass(slots=True)
class OutputCount:
    """Output tokens received so far, counted as the chunks arrive (what a stopped stream is
    billed): a content chunk a token or four characters one, whichever is more, plus tool call
    arguments at four characters a token. Metering reads `tokens` between reads."""

    text_chars: int = 0
    text_chunks: int = 0
    tool_chars: int = 0

    def add(self, chunk: dict[str, Any], text: str | None) -> None:
        """Count one chunk (`text` its content delta, if any)."""
        if text:
            self.text_chars += len(text)
            self.text_chunks += 1
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return
        delta = choices[0].get("delta")
        pieces = delta.get("tool_calls") if isinstance(delta, dict) else None
        if not isinstance(pieces, list):
            return
        for piece in pieces:
            function = piece.get("function") if isinstance(piece, dict) else None
            arguments = function.get("arguments") if isinstance(function, dict) else None
            if isinstance(arguments, str):
                self.tool_chars += len(arguments)

    @property
    def tokens(self) -> int:
        """Output tokens so far."""
        text = max(self.text_chunks, -(-self.text_chars // CHARS_PER_TOKEN))
        return text + -(-self.tool_chars // CHARS_PER_TOKEN)
