"""Real `bullpen` processes in acceptance tests: a free port, and waiting until one listens."""

from __future__ import annotations

import socket
import subprocess
import time

import pytest


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until_listening(port: int, proc: subprocess.Popen[str], seconds: float = 30) -> None:
    """Return once the port accepts connections; fail if `proc` exits or time runs out first."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail("server did not start")
            time.sleep(0.05)
