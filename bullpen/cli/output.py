"""What every command group prints: the stderr console, `error: …` and exit 1, confirmations,
JSON bodies and tables.

Results go to stdout (JSON with --json, else tables); errors, confirmations and progress go to
stderr, so that stdout stays parseable.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console

__all__ = ["AsJson", "console", "fail", "print_json", "print_table", "say"]

console = Console(stderr=True)

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
    """A confirmation, on stderr so that stdout stays parseable."""
    console.print(message, markup=False, highlight=False)


def print_json(body: Any) -> None:
    """`body` as one JSON line on stdout."""
    print(json.dumps(body, ensure_ascii=False), flush=True)


def print_table(table: Any) -> None:
    """A rich renderable on stdout, at least 120 columns wide (so that pipes get whole rows)."""
    Console(width=max(Console().width, 120)).print(table)
