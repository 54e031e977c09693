"""How a request or one of its dispatch attempts fails (services.router.dispatch)."""

from __future__ import annotations

from testbed.dispatch.core import Failure

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
    """One dispatch attempt failed; the router may retry elsewhere (what the next attempt
    avoids: `failure`, dispatch.core.Failure)."""

    def __init__(
        self,
        reason: str,
        *,
        dead: str | None = None,
        link_failed: bool = False,
        suspect: str | None = None,
    ):
        super().__init__(reason)
        self.failure = Failure(reason, dead, link_failed, suspect)

    @classmethod
    def of(cls, failure: Failure) -> AttemptError:
        return cls(
            failure.reason,
            dead=failure.dead,
            link_failed=failure.link_failed,
            suspect=failure.suspect,
        )

    @property
    def reason(self) -> str:
        return self.failure.reason

    @property
    def dead(self) -> str | None:
        """An instance that did not answer: out of rotation until /health answers."""
        return self.failure.dead

    @property
    def link_failed(self) -> bool:
        """The KV could not cross the link: retry with local prefill."""
        return self.failure.link_failed

    @property
    def suspect(self) -> str | None:
        """An instance this request should avoid on its next attempt (not marked down)."""
        return self.failure.suspect
