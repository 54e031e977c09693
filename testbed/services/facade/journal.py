"""The attempts a half of the router-facing API saw, for the run's records.

An external router keeps no record a run could read, and replaces or drops what would join its
two calls (SGLang's gateway drops unknown fields of chat requests; vllm-router replaces the
client's X-Request-Id). So each half journals every attempt it served, by the client's
`testbed_request_id` and the gateway's bootstrap room, completed, failed or released, and the
runner reads `GET /facade/attempts?after=SEQ` while the run goes (a killed instance loses only
what it had not yet been asked for) and joins them with what the client saw.
"""

from __future__ import annotations

import collections
import secrets
from typing import Any, Final

from aiohttp import web

__all__ = ["MAX_ATTEMPTS", "VERIFIED", "AttemptJournal", "attempts_handler"]

MAX_ATTEMPTS: Final = 100_000
"""Attempts a half keeps for the runner (it reads them every quarter second)."""
VERIFIED: Final = "verified"
"""A decode attempt's progress entry, journaled when its KV is verified and before it answers:
an attempt whose worker dies while it streams ends with no outcome, and without this entry its
record would not show that the tokens its client got came from verified KV."""


class AttemptJournal:
    """A bounded, sequenced list of attempt documents."""

    def __init__(self, limit: int = MAX_ATTEMPTS) -> None:
        self.entries: collections.deque[dict[str, Any]] = collections.deque(maxlen=limit)
        self.seq = 0
        self.boot = secrets.token_hex(8)
        """This journal's identity: a restarted worker's journal counts from 1 again, and a
        reader that sees another boot reads it from the start."""
        self.outcomes: collections.Counter[str] = collections.Counter()
        """Attempts by outcome (completed, failed, released), for /stats."""

    def add(self, outcome: str, **doc: Any) -> None:
        self.seq += 1
        self.outcomes[outcome] += 1
        self.entries.append({"seq": self.seq, "outcome": outcome, **doc})

    def progress(self, **doc: Any) -> None:
        """A VERIFIED entry (not an outcome: the attempt journals its outcome when it ends)."""
        self.seq += 1
        self.entries.append({"seq": self.seq, "outcome": VERIFIED, **doc})

    def after(self, seq: int) -> list[dict[str, Any]]:
        return [e for e in self.entries if e["seq"] > seq]


def attempts_handler(journal: AttemptJournal) -> Any:
    async def handler(request: web.Request) -> web.Response:
        try:
            after = int(request.query.get("after", "0"))
        except ValueError:
            raise web.HTTPBadRequest(text='{"error": "after must be an integer"}') from None
        return web.json_response(
            {"seq": journal.seq, "boot": journal.boot, "attempts": journal.after(after)}
        )

    return handler
