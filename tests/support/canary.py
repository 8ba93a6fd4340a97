"""Canary secrets: the forms a secret takes in transit, to search every sink for."""

from __future__ import annotations

import base64
from urllib.parse import quote, quote_plus


def encodings(secret: str) -> list[str]:
    """The canary as it would look plain, URL-encoded or base64-encoded at any alignment."""
    raw = secret.encode()
    forms = {secret, quote(secret, safe=""), quote_plus(secret)}
    for offset in range(3):
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            encoded = encode(b"\0" * offset + raw).decode().rstrip("=")
            forms.add(encoded[4:-4])  # the part that does not depend on what surrounds it
    return sorted(forms)
