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
from typing import Any, Final

from aiohttp import web

__all__ = ["MAX_ATTEMPTS", "AttemptJournal", "attempts_handler"]

MAX_ATTEMPTS: Final = 100_000
"""Attempts a half keeps for the runner (it reads them every quarter second)."""


class AttemptJournal:
    """A bounded, sequenced list of attempt documents."""

    def __init__(self, limit: int = MAX_ATTEMPTS) -> None:
        self.entries: collections.deque[dict[str, Any]] = collections.deque(maxlen=limit)
        self.seq = 0
        self.outcomes: collections.Counter[str] = collections.Counter()
        """Attempts by outcome (completed, failed, released), for /stats."""

    def add(self, outcome: str, **doc: Any) -> None:
        self.seq += 1
        self.outcomes[outcome] += 1
        self.entries.append({"seq": self.seq, "outcome": outcome, **doc})

    def after(self, seq: int) -> list[dict[str, Any]]:
        return [e for e in self.entries if e["seq"] > seq]


def attempts_handler(journal: AttemptJournal) -> Any:
    async def handler(request: web.Request) -> web.Response:
        try:
            after = int(request.query.get("after", "0"))
        except ValueError:
            raise web.HTTPBadRequest(text='{"error": "after must be an integer"}') from None
        return web.json_response({"seq": journal.seq, "attempts": journal.after(after)})

    return handler
