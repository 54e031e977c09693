"""The request ids a router has taken, kept compactly so a standing router does not grow a set
entry per request.

Ids are unique for the router's lifetime: a reused one is refused (HTTP 409,
services.router.intake.claim), in flight or finished. The ids the router assigns itself
(`q000001`, `q000002`, ... in order) cost nothing to remember: every canonical `q<n>` with n up to
the highest assigned counts as taken (those the counter skipped were a client's already). Only
ids a client chose are kept one by one, for the router's lifetime; under `testbed up` the
OpenAI routes never take a client's id, so that set stays empty unless `/generate` callers
bring their own.
"""

from __future__ import annotations

__all__ = ["RequestIds"]

PREFIX = "q"


def _assigned_number(rid: str) -> int | None:
    """n when `rid` is exactly the id the router assigns as its n-th (`q%06d`), else None."""
    digits = rid[len(PREFIX) :]
    if not rid.startswith(PREFIX) or not digits.isascii() or not digits.isdigit():
        return None
    n = int(digits)
    return n if n > 0 and rid == f"{PREFIX}{n:06d}" else None


class RequestIds:
    """Which ids are taken: the router's own up to `assigned`, and the clients' set."""

    def __init__(self) -> None:
        self.assigned = 0
        """The highest number the router has handed out as an id (`q%06d`)."""
        self._offered = 0
        self.chosen: set[str] = set()
        """Ids clients chose (any string of 1 to 60 bytes)."""

    def fresh(self) -> str:
        """The next id the router would assign, skipping any a client already chose; it is taken
        only once `claim`ed (intake.claim claims it at once)."""
        n = self.assigned + 1
        while f"{PREFIX}{n:06d}" in self.chosen:
            n += 1
        self._offered = n
        return f"{PREFIX}{n:06d}"

    def claim(self, rid: str) -> bool:
        """Take `rid`; False if it was taken before."""
        n = _assigned_number(rid)
        if (n is not None and n <= self.assigned) or rid in self.chosen:
            return False
        if n is not None and n == self._offered:
            self.assigned, self._offered = n, 0
        else:
            self.chosen.add(rid)
        return True

    def __contains__(self, rid: object) -> bool:
        if not isinstance(rid, str):
            return False
        n = _assigned_number(rid)
        return (n is not None and n <= self.assigned) or rid in self.chosen
