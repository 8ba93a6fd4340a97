"""Options the API command groups share (which server, with which key) and secrets read from
the environment or stdin, never from argv."""

from __future__ import annotations

from typing import Annotated

import typer

from bullpen.cli.output import fail

__all__ = ["DEFAULT_URL", "ServerKey", "ServerUrl", "read_secret"]

DEFAULT_URL = "http://127.0.0.1:8000"

ServerUrl = Annotated[
    str, typer.Option("--url", envvar="BULLPEN_URL", help="The Bullpen server (BULLPEN_URL).")
]
ServerKey = Annotated[
    str,
    typer.Option(
        "--api-key",
        envvar="BULLPEN_API_KEY",
        show_envvar=False,
        help="Bullpen API key; prefer BULLPEN_API_KEY, which stays out of shell history.",
    ),
]


def read_secret(
    env_var: str | None, from_stdin: bool, *, what: str, flags: tuple[str, str]
) -> str | None:
    """A secret (`what`) from $env_var or stdin, never from argv (which `ps` and history show);
    `flags` are the two options' names, for the error."""
    import getpass
    import os
    import sys

    if env_var is not None and from_stdin:
        raise typer.BadParameter(f"give {flags[0]} or {flags[1]}, not both")
    if env_var is not None:
        value = os.environ.get(env_var, "").strip()
        if not value:
            fail(f"environment variable {env_var} is not set or empty")
        return value
    if not from_stdin:
        return None
    value = getpass.getpass(f"{what}: ") if sys.stdin.isatty() else sys.stdin.read()
    if not value.strip():
        fail(f"no {what} on stdin")
    return value.strip()
