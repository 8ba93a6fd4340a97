"""Bearer secrets: API keys and session ids, stored only as HMAC-SHA-256 digests."""

from __future__ import annotations

import hashlib
import hmac
import secrets

API_KEY_PREFIX = "bp_"
_KEY_BYTES = 32  # 256 random bits
VISIBLE_PREFIX_LEN = 11  # "bp_" + 8 characters, shown in listings to tell keys apart


def new_api_key() -> str:
    """A fresh API key: `bp_` followed by 256 random bits, URL-safe base64."""
    return API_KEY_PREFIX + secrets.token_urlsafe(_KEY_BYTES)


def new_session_id() -> str:
    """A fresh session id (256 random bits)."""
    return secrets.token_urlsafe(_KEY_BYTES)


def digest(secret: bytes, token: str) -> bytes:
    """The HMAC-SHA-256 digest a token is stored and looked up by."""
    return hmac.new(secret, token.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()


def visible_prefix(api_key: str) -> str:
    """The part of a key that may be displayed again after creation."""
    return api_key[:VISIBLE_PREFIX_LEN]


def looks_like_api_key(token: str) -> bool:
    """Cheap shape check before any database work."""
    return token.startswith(API_KEY_PREFIX) and 20 <= len(token) <= 128
