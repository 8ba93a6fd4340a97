"""Log lines: JSON off a terminal, text on one (or as BULLPEN_LOG_FORMAT forces), one record
a line either way."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from bullpen import logs
from bullpen.settings import Settings


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def restored() -> Iterator[None]:
    """Put the root logger and alembic's back as they were after `logs.configure`."""
    root = logging.getLogger()
    alembic = logging.getLogger("alembic.runtime.migration")
    handlers, level, alembic_level = root.handlers[:], root.level, alembic.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        alembic.setLevel(alembic_level)


def record(message: str, *args: object, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("bad\nthing")
        except ValueError:
            exc_info = sys.exc_info()
    return logging.LogRecord("bullpen.test", logging.WARNING, __file__, 1, message, args, exc_info)


def test_the_format_is_text_on_a_terminal_and_json_elsewhere_unless_forced() -> None:
    assert logs.resolve_format("auto", Terminal()) == "text"
    assert logs.resolve_format("auto", io.StringIO()) == "json"
    assert logs.resolve_format("json", Terminal()) == "json"
    assert logs.resolve_format("text", io.StringIO()) == "text"


def test_a_json_line_parses_and_carries_time_level_logger_and_message() -> None:
    line = logs.JsonFormatter().format(record("got %s", "it", exc=True))
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["level"] == "warning" and entry["logger"] == "bullpen.test"
    assert entry["message"] == "got it" and entry["time"]
    assert "ValueError: bad\nthing" in entry["exception"]


def test_a_text_line_is_readable_and_escapes_what_could_forge_or_hide_a_record() -> None:
    line = logs.TextFormatter().format(record("got %s", "a\nWARNING forged\r\x1b[2Jb\tc"))
    assert line.endswith(" WARNING  bullpen.test: got a\\nWARNING forged\\r\\x1b[2Jb\tc")
    assert "\n" not in line and "\x1b" not in line
    rows = logs.TextFormatter().format(record("failed", exc=True)).split("\n")
    assert rows[0].endswith("bullpen.test: failed")
    assert rows[1] == "    Traceback (most recent call last):"
    assert rows[-2:] == ["    ValueError: bad", "    thing"]  # every row indented under it
    assert all(row.startswith("    ") for row in rows[1:])


@pytest.mark.usefixtures("restored")
@pytest.mark.parametrize(
    ("setting", "stream", "text"),
    [
        ("auto", Terminal(), True),
        ("auto", io.StringIO(), False),
        ("json", Terminal(), False),
        ("text", io.StringIO(), True),
    ],
)
def test_configure_writes_the_chosen_format_and_silences_alembics_revision_lines(
    setting: str, stream: io.StringIO, text: bool
) -> None:
    logs.configure(setting, stream=stream)
    logging.getLogger("alembic.runtime.migration").info("Running upgrade 0001 -> 0002")
    logging.getLogger("bullpen.store.migrate").info("database schema up to date (%s)", "0010")
    [line] = stream.getvalue().splitlines()
    if text:
        assert line.endswith(" INFO     bullpen.store.migrate: database schema up to date (0010)")
    else:
        entry = json.loads(line)
        assert (entry["level"], entry["logger"]) == ("info", "bullpen.store.migrate")
        assert entry["message"] == "database schema up to date (0010)"


def test_the_setting_reads_json_or_text_and_refuses_anything_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BULLPEN_LOG_FORMAT", "text")
    assert Settings(data_dir=Path("/nonexistent")).log_format == "text"
    assert Settings(data_dir=Path("/nonexistent"), log_format="json").log_format == "json"
    monkeypatch.setenv("BULLPEN_LOG_FORMAT", "xml")
    with pytest.raises(ValidationError, match="log_format"):
        Settings(data_dir=Path("/nonexistent"))
