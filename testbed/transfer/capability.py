"""KV wire ids that are capabilities.

Any local process can connect to a decode instance's KV port and send frames. If wire ids were
guessable (the router's sequential `q000001`, or the client's own id), it could ABORT or corrupt
other requests' transfers. So each dispatch attempt (and each prefix pull) travels under a fresh
random id that only the router, the decode instance (told in /decode or /prefix/receive) and the
prefill instance it picked (told in /prefill or /prefix/send) know. Records and logs keep the
client-visible request id.
"""

from __future__ import annotations

import secrets

__all__ = ["new_wire_id"]

_TOKEN_BYTES = 18
"""144 random bits; base64url makes it 24 characters (the wire allows 64)."""


def new_wire_id() -> str:
    """A fresh, unguessable KV wire id."""
    return secrets.token_urlsafe(_TOKEN_BYTES)
