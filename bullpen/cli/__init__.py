"""The `bullpen` command line: one Typer app (`cli`), one module per command group."""

from bullpen.cli.main import cli, main

__all__ = ["cli", "main"]
