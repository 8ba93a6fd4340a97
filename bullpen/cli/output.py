"""What every command group prints: the stderr console, `error: …` and exit 1, confirmations,
JSON bodies and tables.

Results go to stdout (JSON with --json, else tables); errors, confirmations and progress go to
stderr, so that stdout stays parseable.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["AsJson", "console", "fail", "print_json", "print_table", "say", "styled"]


@functools.cache
def _stderr_console() -> Console:
    from rich.console import Console

    return Console(stderr=True)


class _StderrConsole:
    """rich's stderr console, made on its first use: a server (`bullpen up`, `worker`) prints
    without rich, and so never loads it (about 2 MB of its memory)."""

    def print(self, *objects: Any, **options: Any) -> None:
        _stderr_console().print(*objects, **options)


console = _StderrConsole()

AsJson = Annotated[bool, typer.Option("--json", help="Print the API's JSON body.")]


def fail(detail: str, errors: list[dict[str, Any]] | None = None) -> NoReturn:
    """Print `error: <detail>` (and any field problems) to stderr and exit 1."""
    from rich.text import Text

    console.print(Text.assemble(("error:", "red"), " ", detail), soft_wrap=True)
    for err in errors or []:
        where = err.get("field") or err.get("location") or "request"
        console.print(Text(f"  {where}: {err.get('message')}"), soft_wrap=True)
    raise typer.Exit(1)


def say(message: str) -> None:
    """A confirmation or a server's status line, as given, on stderr so that stdout stays
    parseable."""
    print(message, file=sys.stderr, flush=True)


def styled(text: str, *sgr: str) -> str:
    """`text` in these SGR styles (e.g. "1" bold, "33" yellow) when stderr is a terminal and
    `NO_COLOR` is not set; otherwise as it is."""
    if not sgr or os.environ.get("NO_COLOR") or not sys.stderr.isatty():
        return text
    return f"\x1b[{';'.join(sgr)}m{text}\x1b[0m"


def print_json(body: Any) -> None:
    """`body` as one JSON line on stdout."""
    print(json.dumps(body, ensure_ascii=False), flush=True)


def print_table(table: Any, min_width: int = 120) -> None:
    """A rich renderable on stdout, at least `min_width` columns wide (so that pipes get whole
    rows)."""
    from rich.console import Console

    Console(width=max(Console().width, min_width)).print(table)
