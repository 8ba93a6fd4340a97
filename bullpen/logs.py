"""Logging to stderr: one JSON object a line for collectors, or human-readable lines on a
terminal (`BULLPEN_LOG_FORMAT`). Either way one record is one line: newlines and other control
characters in a message stay escaped, so no message can forge or hide a record."""

from __future__ import annotations

import logging
import re
import sys
from typing import Literal, TextIO

import orjson

__all__ = ["JsonFormatter", "TextFormatter", "configure", "resolve_format"]

LogFormat = Literal["json", "text"]

# C0 controls but tab, DEL and C1: line breaks and terminal escape sequences.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


class JsonFormatter(logging.Formatter):
    """Render a record as a single JSON line."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


class TextFormatter(logging.Formatter):
    """Render a record as `time level logger: message`, a traceback indented below it."""

    def format(self, record: logging.LogRecord) -> str:
        message = _CONTROL.sub(_escape, record.getMessage())
        line = (
            f"{self.formatTime(record, '%Y-%m-%d %H:%M:%S')} {record.levelname:<8} "
            f"{record.name}: {message}"
        )
        if record.exc_info:
            trace = self.formatException(record.exc_info).split("\n")
            line += "".join("\n    " + _CONTROL.sub(_escape, row) for row in trace)
        return line


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return {"\n": "\\n", "\r": "\\r"}.get(char, f"\\x{ord(char):02x}")


def resolve_format(setting: str, stream: TextIO) -> LogFormat:
    """`json` or `text` for the setting; `auto` is text on a terminal, else JSON."""
    if setting in ("json", "text"):
        return setting  # type: ignore[return-value]
    isatty = getattr(stream, "isatty", None)
    return "text" if isatty is not None and isatty() else "json"


def configure(log_format: str = "auto", level: str = "INFO", stream: TextIO | None = None) -> None:
    """Send every log record to `stream` (stderr) in `log_format` (see `resolve_format`)."""
    stream = sys.stderr if stream is None else stream
    handler = logging.StreamHandler(stream)
    text = resolve_format(log_format, stream) == "text"
    handler.setFormatter(TextFormatter() if text else JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Alembic says a line per revision, and about its own set-up when it is first imported
    # (now only when a schema is behind: bullpen.store.migrate); bullpen.store.migrate sums a
    # start-up's migrations up in one.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    # The MCP SDK says a line per stateless `/mcp` request ("Terminating session: None").
    logging.getLogger("mcp").setLevel(logging.WARNING)
