"""How a request or one of its dispatch attempts fails (services.router.dispatch)."""

from __future__ import annotations

__all__ = ["CLIENT_GONE", "SHUT_DOWN", "AttemptError", "ClientGone", "RequestError"]

CLIENT_GONE = "client disconnected"
SHUT_DOWN = "router shut down"


class RequestError(Exception):
    """A request failed for good; the message is the failure reason recorded for it."""


class ClientGone(Exception):
    """The client that sent the request went away: its request stops and no instance is blamed.

    Deliberately not an aiohttp.ClientError: a failed write to the departed client must not
    look like a lost decode stream (which takes the decode instance out of rotation)."""


class AttemptError(Exception):
    """One dispatch attempt failed; the router may retry elsewhere."""

    def __init__(
        self,
        reason: str,
        *,
        dead: str | None = None,
        link_failed: bool = False,
        suspect: str | None = None,
    ):
        super().__init__(reason)
        self.reason = reason
        self.dead = dead
        """An instance that did not answer: out of rotation until /health answers."""
        self.link_failed = link_failed
        """The KV could not cross the link: retry with local prefill."""
        self.suspect = suspect
        """An instance this request should avoid on its next attempt (not marked down)."""
