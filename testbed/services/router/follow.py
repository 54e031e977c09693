"""`GET /events`: the router's scheduler events and policy changes, streamed as they happen.

One NDJSON line per event, `{"seq", "t", "kind", ...}`, `t` in real-world seconds on the
services' clock (their epoch `t0`): first the kept events numbered above `?after=N` (default 0:
all of them), then one `policy` line with the policy inputs in force now, then every event as it
happens (decisions such as `threshold`, `split_check`, `drain`, `switched`, `split`, and a
`policy` line whenever the threshold or the scarcity verdict changes). A reader that reconnects
passes the last `seq` it saw. The stream ends when the router stops, or when its reader falls
more than MAX_BEHIND events behind (it reconnects and resumes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque

import aiohttp
from aiohttp import web

from testbed.scheduler.state import SchedulerEvent
from testbed.services.router.intake import STATE, api_error

__all__ = ["FOLLOWERS", "Follower", "events"]

MAX_BEHIND = 10_000
MAX_AFTER = 1 << 62


class Follower:
    """One open stream's queue of events not yet written."""

    def __init__(self) -> None:
        self.queue: deque[SchedulerEvent] = deque()
        self.wake = asyncio.Event()
        self.ended = False

    def push(self, event: SchedulerEvent) -> None:
        if len(self.queue) >= MAX_BEHIND:  # a reader that does not keep up resumes later
            self.ended = True
        else:
            self.queue.append(event)
        self.wake.set()

    def end(self) -> None:
        self.ended = True
        self.wake.set()

    async def next(self) -> SchedulerEvent | None:
        """The next event, or None once the stream ends (after the queued ones)."""
        while not self.queue:
            if self.ended:
                return None
            self.wake.clear()
            await self.wake.wait()
        return self.queue.popleft()


FOLLOWERS = web.AppKey("followers", set[Follower])


def _after(request: web.Request) -> int:
    raw = request.query.get("after", "0")
    if not raw.isdigit() or len(raw) > 19 or int(raw) > MAX_AFTER:
        raise api_error("after must be a non-negative integer (an event's seq)")
    return int(raw)


async def events(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    after = _after(request)
    sched = state.scheduler
    follower = Follower()
    followers = request.app[FOLLOWERS]
    stop = sched.listen(follower.push)  # before the backlog: nothing falls between the two
    followers.add(follower)
    try:
        backlog = [*sched.since(after), sched.policy_event()]
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        with contextlib.suppress(ConnectionError, aiohttp.ClientConnectionResetError):
            for past in backlog:
                await resp.write(_line(past))
            while (event := await follower.next()) is not None:
                await resp.write(_line(event))
        return resp
    finally:
        stop()
        followers.discard(follower)


def _line(event: SchedulerEvent) -> bytes:
    return (json.dumps(event.to_json(), separators=(",", ":")) + "\n").encode()
