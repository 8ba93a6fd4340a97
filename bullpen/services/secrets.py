"""The server secret that keys HMAC digests of API keys, sessions and CSRF tokens."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from bullpen.errors import BullpenError

_MIN_SECRET_CHARS = 32


def load_secret(configured: str | None, data_dir: Path) -> bytes:
    """`BULLPEN_SECRET_KEY`, else a 0600 file in the data directory made on first start."""
    if configured:
        if len(configured) < _MIN_SECRET_CHARS:
            raise BullpenError(
                f"BULLPEN_SECRET_KEY must be at least {_MIN_SECRET_CHARS} characters"
            )
        return configured.encode()
    path = data_dir / "secret.key"
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32))
    value = path.read_text().strip()
    if len(value) < _MIN_SECRET_CHARS:
        raise BullpenError(f"{path} is shorter than {_MIN_SECRET_CHARS} characters")
    return value.encode()
