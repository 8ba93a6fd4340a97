"""The server secret (HMAC key of API keys, sessions and CSRF tokens) and secrets at rest."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

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


_SEAL_VERSION = b"\x01"
_NONCE_BYTES = 12


class SecretBox:
    """AES-256-GCM for secrets at rest (provider API keys), keyed from the server secret.

    The AES key is derived with HKDF, so it is never the HMAC key itself. Each sealed value is
    bound to a context (its row's id) as associated data: a ciphertext copied onto another row
    does not open.
    """

    def __init__(self, master: bytes) -> None:
        key = HKDF(
            algorithm=hashes.SHA256(), length=32, salt=None, info=b"bullpen secrets at rest v1"
        ).derive(master)
        self._aead = AESGCM(key)

    def seal(self, plaintext: str, context: bytes) -> bytes:
        """Version byte, random nonce, ciphertext and tag."""
        nonce = os.urandom(_NONCE_BYTES)
        return _SEAL_VERSION + nonce + self._aead.encrypt(nonce, plaintext.encode(), context)

    def open(self, sealed: bytes, context: bytes) -> str:
        """The plaintext; a value sealed under another key or context is an error."""
        if sealed[:1] != _SEAL_VERSION:
            raise BullpenError("a stored secret has an unknown format")
        nonce, body = sealed[1 : 1 + _NONCE_BYTES], sealed[1 + _NONCE_BYTES :]
        try:
            return self._aead.decrypt(nonce, body, context).decode()
        except InvalidTag:
            raise BullpenError(
                "a stored secret does not open with this server's key "
                "(was BULLPEN_SECRET_KEY or the data directory's secret.key changed?)"
            ) from None


def hint(secret: str) -> str:
    """A masked form that identifies a key to its owner without revealing it."""
    if len(secret) < 16:
        return "…" + secret[-2:]
    return secret[:3] + "…" + secret[-4:]
