"""What crosses to a spawned API child (`--processes N`) and what it builds there: the same
edge as a single-process server, rebuilt from the settings after pickling."""

from __future__ import annotations

import logging
import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest

from bullpen.api.edge import BoundedHttpProtocol
from bullpen.api.processes import ChildConfig
from bullpen.settings import Settings

OPTIONS = {"host": "127.0.0.1", "port": 0, "loop": "uvloop", "backlog": 4096, "workers": 2}


@pytest.fixture
def kept_logging() -> Iterator[None]:
    """`load()` configures Bullpen's logging, as a child does: undone after the test."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    migrate = logging.getLogger("bullpen.store.migrate")
    migrate_level = migrate.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        migrate.setLevel(migrate_level)


@pytest.mark.usefixtures("kept_logging")
def test_a_child_builds_the_edge_of_a_single_server(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path,
        database_url="postgresql://postgres@127.0.0.1:5432/none",
        max_header_bytes=4096,
        header_timeout_s=3.0,
        max_connections=77,
    )
    config = pickle.loads(pickle.dumps(ChildConfig(settings, OPTIONS)))
    assert isinstance(config, ChildConfig)
    assert not config.loaded  # nothing heavy happens while a child unpickles

    config.load()
    protocol = config.http_protocol_class
    assert issubclass(protocol, BoundedHttpProtocol)
    assert (protocol.max_head_bytes, protocol.head_timeout_s) == (4096, 3.0)
    assert config.limit_concurrency == 78
    assert (config.backlog, config.loop, config.workers) == (4096, "uvloop", 2)
    assert config.access_log is False
    assert config.loaded_app is not None
