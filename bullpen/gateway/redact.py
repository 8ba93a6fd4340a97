"""Keep a provider's API key out of text that streams back from it.

A provider (or a model told to) can echo request values, the key among them. Text passes
through a `Redactor` before it reaches anyone: whole occurrences are replaced, and a tail that
could be the start of a key is held back until the next piece shows whether it is one. That
delays a few characters by one piece at most (text ending in `s` when keys start `sk-`), and
changes nothing else.

A stream's chunks carry several such texts side by side: the content, a refusal, and the
arguments of each tool call (by index, often interleaved). `ChunkRedactor` keeps one
`Redactor` for each, so a key split across chunks is caught in every one of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MASK = "[redacted]"


class Redactor:
    """A streaming find-and-replace of secrets; `feed` pieces in order, then `flush`."""

    __slots__ = ("_held", "_secrets")

    def __init__(self, secrets: Sequence[str]) -> None:
        self._secrets = tuple(s for s in secrets if s)
        self._held = ""

    @property
    def secrets(self) -> tuple[str, ...]:
        """What this redactor masks."""
        return self._secrets

    def feed(self, piece: str) -> str:
        """The part of `piece` (after what was held) that is safe to pass on now."""
        text = self._held + piece if self._held else piece
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        keep = self._unsafe_tail(text)
        if keep:
            self._held = text[-keep:]
            return text[:-keep]
        self._held = ""
        return text

    def flush(self) -> str:
        """Whatever is still held (the stream ended, so it cannot complete a secret)."""
        held, self._held = self._held, ""
        return held

    def _unsafe_tail(self, text: str) -> int:
        """The length of the longest tail of `text` that starts some secret."""
        longest = 0
        for secret in self._secrets:
            first = secret[0]
            start = max(0, len(text) - len(secret) + 1)
            i = text.find(first, start)
            while i != -1:
                if secret.startswith(text[i:]):
                    longest = max(longest, len(text) - i)
                    break
                i = text.find(first, i + 1)
        return longest


def scrub(text: str, secrets: Sequence[str]) -> str:
    """`text` with every whole occurrence of each secret masked."""
    for secret in secrets:
        if secret and secret in text:
            text = text.replace(secret, MASK)
    return text


class ChunkRedactor:
    """Masks secrets in a stream's chat completion chunks, in place (`chunk`, in order).

    The content, the refusal and each tool call's arguments are streams of their own; what one
    holds back comes out with the chunk carrying the finish reason.
    """

    __slots__ = ("_arguments", "_content", "_refusal", "_secrets")

    def __init__(self, secrets: Sequence[str]) -> None:
        self._secrets = tuple(s for s in secrets if s)
        self._content = Redactor(self._secrets)
        self._refusal = Redactor(self._secrets)
        self._arguments: dict[int, Redactor] = {}

    def chunk(self, chunk: dict[str, Any]) -> None:
        """Mask what `chunk` adds to each text, holding back a tail that may start a secret."""
        choices = chunk.get("choices")
        if not choices or not isinstance(choices[0], dict):
            return
        choice = choices[0]
        delta = choice.get("delta")
        if isinstance(delta, dict):
            content = delta.get("content")
            if isinstance(content, str) and content:
                delta["content"] = self._content.feed(content)
            refusal = delta.get("refusal")
            if isinstance(refusal, str) and refusal:
                delta["refusal"] = self._refusal.feed(refusal)
            calls = delta.get("tool_calls")
            for tool_call in calls if isinstance(calls, list) else ():
                function = tool_call.get("function") if isinstance(tool_call, dict) else None
                if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                    redactor = self._arguments.get(_index(tool_call))
                    if redactor is None:
                        redactor = self._arguments[_index(tool_call)] = Redactor(self._secrets)
                    function["arguments"] = redactor.feed(function["arguments"])
        if choice.get("finish_reason"):
            self._flush(choice)

    def _flush(self, choice: dict[str, Any]) -> None:
        """The stream is finishing: what was held cannot complete a secret any more."""
        content, refusal = self._content.flush(), self._refusal.flush()
        arguments = {i: held for i, r in self._arguments.items() if (held := r.flush())}
        if not (content or refusal or arguments):
            return
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            delta = choice["delta"] = {}
        if content:
            delta["content"] = (delta.get("content") or "") + content
        if refusal:
            delta["refusal"] = (delta.get("refusal") or "") + refusal
        if arguments:
            calls = delta.get("tool_calls")
            if not isinstance(calls, list):
                calls = delta["tool_calls"] = []
            for index, held in arguments.items():
                entry = next(
                    (
                        c["function"]
                        for c in calls
                        if isinstance(c, dict)
                        and _index(c) == index
                        and isinstance(c.get("function"), dict)
                    ),
                    None,
                )
                if entry is None:
                    calls.append({"index": index, "function": {"arguments": held}})
                else:
                    entry["arguments"] = (entry.get("arguments") or "") + held


def _index(tool_call: dict[str, Any]) -> int:
    """A tool call delta's index (0 when missing or not a whole number, as readers take it)."""
    index = tool_call.get("index", 0)
    return index if isinstance(index, int) and not isinstance(index, bool) else 0
