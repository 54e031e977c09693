"""`GET /records`: the router's finished records, streamed as they end, for a runner that must
keep every one even if it is killed (`testbed up`: scenario.standing).

One NDJSON line per record, `{"seq": n, "record": {...}}`, `seq` counting from 1 in the order
the requests ended: first the records numbered above `?after=N` (default 0: all of them), then
each one as it ends. The stream ends when the router stops.

A reader that asks `?keep=1` is a keeper: it writes each record to durable storage and then
says so with `POST /records/kept {"seq": n}`. While a keeper is connected, a request's answer
is held back after its record is made until a keeper has kept it (at most KEEP_WAIT_S wall
seconds), so a client that has seen its request finish knows the record is on disk: a SIGKILL
of the runner loses nothing that any client saw end. Without a keeper nothing waits (`testbed
run` reads records from its own requests' answers).
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import aiohttp
from aiohttp import web

from testbed.metrics.records import RequestRecord
from testbed.services.validate import int_field, json_body

__all__ = ["KEEP_WAIT_S", "RECORDS", "RecordLog", "add_record_routes"]

KEEP_WAIT_S = 2.0
"""Wall seconds an answer waits for a keeper before it goes out anyway (a keeper that hangs
must not hang every client)."""
MAX_AFTER = 1 << 62
GONE_CHECK_S = 0.5
"""Wall seconds between checks, while no record comes, that the reader is still there."""


class RecordLog:
    """The router's finished records in the order they ended, and the readers following them."""

    def __init__(self) -> None:
        self.records: list[RequestRecord] = []
        self.keepers = 0
        """Connected readers that acknowledge what they have kept."""
        self.kept = 0
        """Highest `seq` a keeper has acknowledged."""
        self.closed = False
        self._readers: set[asyncio.Event] = set()
        self._changed = asyncio.Condition()

    def append(self, rec: RequestRecord) -> int:
        """Add a finished record; returns its `seq`."""
        self.records.append(rec)
        for wake in self._readers:
            wake.set()
        return len(self.records)

    async def wait_kept(self, seq: int, timeout_s: float = KEEP_WAIT_S) -> bool:
        """Until a keeper has kept record `seq` (True), or there is no keeper, or the wait
        times out (False)."""
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self._changed.wait_for(
                        lambda: self.kept >= seq or not self.keepers or self.closed
                    )
            return self.kept >= seq

    async def mark_kept(self, seq: int) -> None:
        async with self._changed:
            self.kept = max(self.kept, min(seq, len(self.records)))
            self._changed.notify_all()

    async def close(self) -> None:
        """The router stops: every stream ends, nothing waits for a keeper any more."""
        self.closed = True
        for wake in self._readers:
            wake.set()
        async with self._changed:
            self._changed.notify_all()

    async def stream(self, request: web.Request, resp: web.StreamResponse, after: int) -> None:
        """Write records `after`+1.. to `resp` as they come, until the router stops or the
        reader goes away (seen within GONE_CHECK_S: a reader that left is no keeper)."""
        keep = request.query.get("keep", "0") == "1"
        wake = asyncio.Event()
        self._readers.add(wake)
        if keep:
            self.keepers += 1
        sent = min(after, len(self.records))
        try:
            with contextlib.suppress(ConnectionError, aiohttp.ClientConnectionResetError):
                while not self.closed:  # one pass per wake-up; ends with the router
                    wake.clear()
                    while sent < len(self.records):
                        doc = {"seq": sent + 1, "record": self.records[sent].to_json()}
                        await resp.write((json.dumps(doc, separators=(",", ":")) + "\n").encode())
                        sent += 1
                    if not self.closed and sent == len(self.records):
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(wake.wait(), GONE_CHECK_S)
                    transport = request.transport
                    if transport is None or transport.is_closing():
                        break
        finally:
            self._readers.discard(wake)
            if keep:
                self.keepers -= 1
                async with self._changed:
                    self._changed.notify_all()


RECORDS = web.AppKey("records", RecordLog)


async def _records(request: web.Request) -> web.StreamResponse:
    raw = request.query.get("after", "0")
    if not raw.isdigit() or len(raw) > 19 or int(raw) > MAX_AFTER:
        raise web.HTTPBadRequest(text="after must be a non-negative integer (a record's seq)")
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await resp.prepare(request)
    await request.app[RECORDS].stream(request, resp, int(raw))
    return resp


async def _kept(request: web.Request) -> web.Response:
    seq = int_field(await json_body(request), "seq", 0, MAX_AFTER)
    await request.app[RECORDS].mark_kept(seq)
    return web.json_response({"kept": request.app[RECORDS].kept})


def add_record_routes(app: web.Application, log: RecordLog) -> None:
    """`GET /records` and `POST /records/kept` over `log`; the log closes when the app stops."""
    app[RECORDS] = log
    app.router.add_get("/records", _records)
    app.router.add_post("/records/kept", _kept)

    async def _closing(_app: web.Application) -> None:
        await log.close()

    app.on_shutdown.append(_closing)
