"""Keep a provider's API key out of text that streams back from it.

A provider (or a model told to) can echo request values, the key among them. Text passes
through a `Redactor` before it reaches anyone: whole occurrences are replaced, and a tail that
could be the start of a key is held back until the next piece shows whether it is one. That
delays a few characters by one piece at most (text ending in `s` when keys start `sk-`), and
changes nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence

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
