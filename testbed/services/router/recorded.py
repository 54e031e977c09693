"""`GET /records`: the router's finished records, streamed as they end, for a runner that must
keep every one even if it is killed (`testbed up`: scenario.standing); the log behind
`GET /history` too (services.router.api).

One NDJSON line per record, `{"seq": n, "record": {...}}`, `seq` counting from 1 in the order
the requests ended: first the records numbered above `?after=N` (default 0: all of them), then
each one as it ends. The stream ends when the router stops.

The keeper. A reader that asks `?keep=1` with the run's keeper token (header KEEPER_HEADER;
`ServiceSpec.keeper_token`, which only the runner that started the router knows) is a keeper:
it writes each record to durable storage and then says so with `POST /records/kept {"seq": n}`
(same header). A router given a token (`testbed up`) holds every request's answer, from its
start until it stops, after the record is made until a keeper has kept it, with no time limit
(also before the keeper's first connection, so no answer slips out between the router's start
and the runner's first read):
a client that has seen its request finish knows the record is on disk, and a runner stalled
(SIGSTOP) and then killed loses nothing any client saw end. The price: a stalled keeper stalls
every answer. That is made visible: after KEEPER_STALL_S wall seconds on one answer the router
logs one line, and `/stats`'s `keeper` says `stalled` (and counts the answers held) until the
keeper has caught up, when it logs a second line. Without a keeper (`testbed run` reads records
from its own requests' answers) nothing waits; without a token no reader can be a keeper.

Memory. Records a keeper has kept are on disk, so the router drops them, keeping the last
KEEP_TAIL for readers; a reader asking for records already dropped (`?after=` below the first
held `seq` - 1) gets HTTP 410 with `first_seq`. Records no keeper has kept are never dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from typing import Any

import aiohttp
from aiohttp import web

from testbed.metrics.records import RequestRecord
from testbed.services.validate import int_field, json_body

__all__ = [
    "HISTORY_PAGE",
    "KEEPER_HEADER",
    "KEEPER_STALL_S",
    "KEEP_TAIL",
    "RECORDS",
    "RecordLog",
    "RecordsGone",
    "add_record_routes",
    "after_param",
    "gone",
]

log = logging.getLogger(__name__)

KEEPER_HEADER = "X-Testbed-Keeper-Token"
"""The header that carries the keeper token on `GET /records?keep=1` and `POST /records/kept`."""
KEEPER_STALL_S = 2.0
"""Wall seconds an answer waits for the keeper before the router calls the keeper stalled (one
log line, `/stats`' `keeper.stalled`). The answer still waits: it never goes out unkept."""
HISTORY_PAGE = 10_000
"""Records at most in one `GET /history` answer (services.router.api; its default `limit`)."""
KEEP_TAIL = 10_000
"""Kept records the router still holds for readers (`?after=`) once they are on disk."""
TRIM_CHUNK = 1_000
"""Kept records dropped at a time, once the tail is this much over KEEP_TAIL (amortized)."""
MAX_AFTER = 1 << 62
GONE_CHECK_S = 0.5
"""Wall seconds between checks, while no record comes, that the reader is still there."""


class RecordsGone(Exception):
    """Records asked for were dropped (kept on disk by the keeper); `first_seq` is still held."""

    def __init__(self, first_seq: int) -> None:
        super().__init__(first_seq)
        self.first_seq = first_seq


class RecordLog:
    """The router's finished records in the order they ended (the last ones, once a keeper keeps
    them), and the readers following them."""

    def __init__(self, keeper_token: str | None = None, tail: int = KEEP_TAIL) -> None:
        self.keeper_token = keeper_token
        self.tail = tail
        self.held: list[RequestRecord] = []
        """Records `first`..`made`, in `seq` order."""
        self.first = 1
        """`seq` of `held[0]`: every record below it was kept and dropped."""
        self.made = 0
        """Records made so far: the highest `seq`."""
        self.keepers = 0
        """Connected readers that acknowledge what they have kept."""
        self.holds = keeper_token is not None
        """Every answer waits for its record's keeping (a keeper is expected: there is a token)."""
        self.kept = 0
        """Highest `seq` a keeper has acknowledged."""
        self.closed = False
        self.stalled_since: float | None = None
        """Wall time (monotonic) of the first answer that waited KEEPER_STALL_S, until the
        keeper has caught up."""
        self.stalls = 0
        self.longest_hold_s = 0.0
        self._holds: dict[int, asyncio.Future[None]] = {}
        self._readers: set[asyncio.Event] = set()

    # ------------------------------------------------------------------ writing and keeping

    def append(self, rec: RequestRecord) -> int:
        """Add a finished record; returns its `seq`."""
        self.held.append(rec)
        self.made += 1
        for wake in self._readers:
            wake.set()
        return self.made

    def allows(self, token: str | None) -> bool:
        """Whether `token` is this run's keeper token (there is none without one)."""
        return (
            self.keeper_token is not None
            and token is not None
            and hmac.compare_digest(token.encode(), self.keeper_token.encode())
        )

    async def wait_kept(self, seq: int) -> bool:
        """Until a keeper has kept record `seq` (True), however long, on a router with a keeper
        token; at once (False) on one without. A wait over KEEPER_STALL_S marks the keeper
        stalled. Ends only by the keeping or by cancellation (the client left, the router
        stops): an answer never goes out unkept."""
        if self.kept >= seq or not self.holds:
            return self.kept >= seq
        hold = self._holds.setdefault(seq, asyncio.get_running_loop().create_future())
        start = time.monotonic()
        try:
            try:
                await asyncio.wait_for(asyncio.shield(hold), KEEPER_STALL_S)
            except TimeoutError:
                self._stalled(seq)
                await asyncio.shield(hold)
        finally:
            self._holds.pop(seq, None)
            self.longest_hold_s = max(self.longest_hold_s, time.monotonic() - start)
        return True

    def _stalled(self, seq: int) -> None:
        if self.stalled_since is not None:
            return
        self.stalled_since = time.monotonic() - KEEPER_STALL_S
        self.stalls += 1
        log.warning(
            "keeper stalled: record %d not kept after %gs (kept up to %d of %d); answers are held "
            "until the keeper keeps their records",
            seq, KEEPER_STALL_S, self.kept, self.made,
        )  # fmt: skip

    def mark_kept(self, seq: int) -> None:
        """A keeper has `seq` and every record before it on disk: release their answers."""
        if not 0 <= seq <= self.made:
            raise ValueError(f"seq must be between 0 and {self.made} (the last record), got {seq}")
        for s in range(self.kept + 1, seq + 1):
            hold = self._holds.get(s)
            if hold is not None and not hold.done():
                hold.set_result(None)
        self.kept = max(self.kept, seq)
        if self.stalled_since is not None and self.kept >= self.made:
            log.warning(
                "keeper caught up after %.1fs stalled: every record is kept",
                time.monotonic() - self.stalled_since,
            )
            self.stalled_since = None
        self._trim()

    def _trim(self) -> None:
        """Drop kept records (on disk) beyond the last `tail`, a chunk at a time."""
        droppable = min(self.kept - self.first + 1, len(self.held) - self.tail)
        if droppable >= TRIM_CHUNK:
            del self.held[:droppable]
            self.first += droppable

    async def close(self) -> None:
        """The router stops: every stream ends. Held answers stay held (they end with their
        handlers, cancelled as the server stops: a client sees a cut stream, not an end)."""
        self.closed = True
        for wake in self._readers:
            wake.set()

    # ------------------------------------------------------------------ reading

    def page(self, after: int, limit: int) -> list[RequestRecord]:
        """Records `after`+1 .. `after`+`limit` (fewer at the end); RecordsGone if some of them
        were dropped."""
        if after + 1 < self.first:
            raise RecordsGone(self.first)
        start = after + 1 - self.first
        return self.held[start : start + limit]

    def stats(self) -> dict[str, Any]:
        """For `/stats`' `keeper`: whether answers wait, and for how long they have."""
        return {
            "holds": self.holds,
            "connected": self.keepers,
            "recorded": self.made,
            "kept": self.kept,
            "first_held_seq": self.first,
            "answers_held": len(self._holds),
            "stalled": self.stalled_since is not None,
            "stalled_s": (
                None if self.stalled_since is None else time.monotonic() - self.stalled_since
            ),
            "stalls": self.stalls,
            "longest_hold_s": self.longest_hold_s,
        }

    async def stream(
        self, request: web.Request, resp: web.StreamResponse, after: int, keep: bool
    ) -> None:
        """Write records `after`+1.. to `resp` as they come, until the router stops or the
        reader goes away (seen within GONE_CHECK_S: a reader that left is no keeper). A
        reader that falls behind the records held is ended (it resumes and gets 410)."""
        wake = asyncio.Event()
        self._readers.add(wake)
        if keep:
            self.keepers += 1
        sent = min(after, self.made)
        try:
            with contextlib.suppress(ConnectionError, aiohttp.ClientConnectionResetError):
                while not self.closed and sent + 1 >= self.first:  # one pass per wake-up
                    wake.clear()
                    while self.first <= sent + 1 <= self.made:
                        rec = self.held[sent + 1 - self.first]
                        doc = {"seq": sent + 1, "record": rec.to_json()}
                        await resp.write((json.dumps(doc, separators=(",", ":")) + "\n").encode())
                        sent += 1
                    if not self.closed and sent == self.made:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(wake.wait(), GONE_CHECK_S)
                    transport = request.transport
                    if transport is None or transport.is_closing():
                        break
        finally:
            self._readers.discard(wake)
            if keep:
                self.keepers -= 1


RECORDS = web.AppKey("records", RecordLog)


def after_param(request: web.Request) -> int:
    """`?after=N`: a record's `seq` (0: from the first); 400 otherwise."""
    raw = request.query.get("after", "0")
    if not raw.isascii() or not raw.isdigit() or len(raw) > 19 or int(raw) > MAX_AFTER:
        raise web.HTTPBadRequest(text="after must be a non-negative integer (a record's seq)")
    return int(raw)


def gone(exc: RecordsGone) -> web.HTTPException:
    """HTTP 410 for records already dropped, naming the first one still held."""
    return web.HTTPGone(
        text=json.dumps(
            {
                "error": f"records before seq {exc.first_seq} were kept on disk by the keeper "
                "and dropped here; ask from after={exc.first_seq - 1}",
                "first_seq": exc.first_seq,
            }
        ),
        content_type="application/json",
    )


def _keeper(request: web.Request) -> None:
    if not request.app[RECORDS].allows(request.headers.get(KEEPER_HEADER)):
        raise web.HTTPForbidden(text=f"a keeper needs this run's token in {KEEPER_HEADER}")


async def _records(request: web.Request) -> web.StreamResponse:
    after = after_param(request)
    keep = request.query.get("keep", "0") == "1"
    if keep:
        _keeper(request)
    records = request.app[RECORDS]
    if after + 1 < records.first:
        raise gone(RecordsGone(records.first))
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await resp.prepare(request)
    await records.stream(request, resp, after, keep)
    return resp


async def _kept(request: web.Request) -> web.Response:
    _keeper(request)
    records = request.app[RECORDS]
    seq = int_field(await json_body(request), "seq", 0, MAX_AFTER)
    if seq > records.made:
        raise web.HTTPBadRequest(text=f"seq {seq} is above the last record made ({records.made})")
    records.mark_kept(seq)
    return web.json_response({"kept": records.kept})


def add_record_routes(app: web.Application, log: RecordLog) -> None:
    """`GET /records` and `POST /records/kept` over `log`; the log closes when the app stops."""
    app[RECORDS] = log
    app.router.add_get("/records", _records)
    app.router.add_post("/records/kept", _kept)

    async def _closing(_app: web.Application) -> None:
        await log.close()

    app.on_shutdown.append(_closing)
