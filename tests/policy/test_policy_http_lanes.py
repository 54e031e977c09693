"""#30: the HTTP policy's decision path made honest, on both clients (blocking: the sim's;
aiohttp: the live router's), against loopback services in a thread of their own.

Lanes run exchanges at once (each its own router id); a decision with no free lane is `queued`,
one with no whole answer by the deadline `late`, judged when the last byte was read (a faked
clock stands in for a busy event loop); answers over the size cap are `garbage: too large`
(Content-Length, or an endless chunked body read no further than the cap); redirects are never
followed; the blocking client's deadline is total (a trickling service cannot stretch it); the
feedback worker is bounded the same way. The services are raw asyncio streams, so a test says
byte for byte what the service sends."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from testbed.policy import POLICIES
from testbed.policy.base import InstanceLoad, RequestView, Snapshot
from testbed.policy.decider import Decider, Decision, fallback_kind
from testbed.policy.http import HttpPolicy
from testbed.policy.http_client import MAX_ANSWER_BYTES
from testbed.policy.protocol import Outcome
from tests.policy.servers import example_app, serve

ROUTE = json.dumps({"route": {"prefill_cluster": "prfaas", "prefill_instance": "p1",
                              "decode_instance": "d0", "uncached_tokens": 9000}})  # fmt: skip
VIEW = RequestView("q1", 9000, 100)
BOUND_S = 10.0
"""How long a test waits for something that must happen (a hang is the bug, not a speed)."""


def snap() -> Snapshot:
    inst = [InstanceLoad(f"p{i}", "prfaas", "prefill", i, 100.0 * i) for i in range(2)]
    inst += [InstanceLoad("l0", "local", "prefill", 0, 0.0)]
    inst += [InstanceLoad("d0", "local", "decode", 0, 0.0)]
    return Snapshot(1.0, tuple(inst), threshold_tokens=8000.0)


@pytest.fixture(autouse=True)
def _forget_policy_urls() -> Iterator[None]:
    yield
    POLICIES.forget_plugins()


# ------------------------------------------------------------------ raw loopback services

Writer = asyncio.StreamWriter
Handler = Callable[[dict[str, Any], Writer], Awaitable[None]]


def response(status: int, body: bytes = b"", **headers: Any) -> bytes:
    head = {"Content-Length": str(len(body)), "Content-Type": "application/json"}
    head.update({k.replace("_", "-"): str(v) for k, v in headers.items()})
    lines = "".join(f"{k}: {v}\r\n" for k, v in head.items())
    return f"HTTP/1.1 {status} X\r\n{lines}\r\n".encode() + body


class Raw:
    """A service on 127.0.0.1 that hands each request (path, parsed JSON body) to `handler`,
    which writes whatever bytes it likes; requests are kept in `seen`, in order."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.seen: list[dict[str, Any]] = []
        self.in_flight = 0

    async def _conn(self, reader: asyncio.StreamReader, writer: Writer) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                first, *fields = head.decode().split("\r\n")
                hdrs = {k.lower(): v.strip() for k, _, v in (f.partition(":") for f in fields)}
                body = await reader.readexactly(int(hdrs.get("content-length", "0")))
                req = {"path": first.split()[1], "body": json.loads(body or b"null")}
                self.seen.append(req)
                self.in_flight += 1
                try:
                    await self.handler(req, writer)
                finally:
                    self.in_flight -= 1
                await writer.drain()
        writer.close()

    @contextlib.contextmanager
    def running(self) -> Iterator[str]:
        loop = asyncio.new_event_loop()
        box: dict[str, Any] = {}
        ready = threading.Event()

        async def start() -> None:
            box["server"] = await asyncio.start_server(self._conn, "127.0.0.1", 0)
            box["port"] = box["server"].sockets[0].getsockname()[1]
            ready.set()

        t = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()),
                             daemon=True)  # fmt: skip
        t.start()
        assert ready.wait(BOUND_S)
        self.loop = loop
        try:
            yield f"http://127.0.0.1:{box['port']}"
        finally:
            loop.call_soon_threadsafe(loop.stop)
            t.join(BOUND_S)


async def answer_ok(req: dict[str, Any], w: Writer) -> None:
    w.write(response(200, ROUTE.encode()))


async def ask(dec: Decider, blocking: bool) -> Decision:
    return dec.decide(VIEW, snap()) if blocking else await dec.adecide(VIEW, snap())


def kind(d: Decision) -> str:
    return fallback_kind(d.fallback_reason)


BOTH = pytest.mark.parametrize("blocking", [True, False], ids=["sim-client", "live-client"])


# ------------------------------------------------------------------ lanes


async def test_lanes_run_decisions_at_once_each_with_its_router_id() -> None:
    """A service that holds every answer until K requests are in flight: with K lanes all K
    decisions are the policy's (one lane would leave them waiting: `queued`, then `late`)."""
    k = 4
    all_in = asyncio.Event()

    async def barrier(req: dict[str, Any], w: Writer) -> None:
        if svc.in_flight >= k:
            all_in.set()
        await asyncio.wait_for(all_in.wait(), BOUND_S)
        w.write(response(200, ROUTE.encode()))

    svc = Raw(barrier)
    with svc.running() as base:
        dec = Decider.for_spec(f"{base}/route#timeout=8s&lanes={k}")
        try:
            ds = await asyncio.gather(*(dec.adecide(VIEW, snap()) for _ in range(k)))
            assert [d.decided_by for d in ds] == ["policy"] * k, [d.fallback_reason for d in ds]
            assert all(d.answer_s is not None and d.answer_s <= d.wall_s for d in ds)
            policy = dec.policy
            assert isinstance(policy, HttpPolicy)
            routers = {r["body"]["router"] for r in svc.seen}
            assert routers == {lane.router for lane in policy.lanes.all}
            assert all(r["body"]["snapshot"]["base"] is None for r in svc.seen)  # each its own
            d = await dec.adecide(VIEW, snap())  # one at a time now: one lane, on its base
            assert svc.seen[-1]["body"]["router"] in routers and d.decided_by == "policy"
            assert svc.seen[-1]["body"]["snapshot"]["base"] is not None
        finally:
            all_in.set()
            await dec.aclose()


async def test_a_decision_with_no_free_lane_is_queued_and_never_sent() -> None:
    svc = Raw(answer_ok)
    with svc.running() as base:
        dec = Decider.for_spec(f"{base}/route#timeout=30ms&lanes=1")
        policy = dec.policy
        assert isinstance(policy, HttpPolicy)
        lane = await policy.lanes.take(time.monotonic() + BOUND_S, time.monotonic)
        assert lane is not None  # the only lane, busy
        try:
            d = await dec.adecide(VIEW, snap())
        finally:
            policy.lanes.give(lane)
            await dec.aclose()
    assert (d.decided_by, kind(d), d.answer_s) == ("fallback", "queued", None)
    assert "1 lanes busy" in (d.fallback_reason or "") and svc.seen == []


@BOTH
async def test_an_answer_after_the_deadline_is_late_and_abandoned(blocking: bool) -> None:
    async def slow(req: dict[str, Any], w: Writer) -> None:
        await asyncio.sleep(0.3)
        w.write(response(200, ROUTE.encode()))

    with Raw(slow).running() as base:
        dec = Decider.for_spec(f"{base}/route#timeout=50ms")
        try:
            d = await ask(dec, blocking)
        finally:
            await dec.aclose()
    assert (d.decided_by, kind(d), d.answer_s) == ("fallback", "late", None)
    assert d.route.prefill_instance == "p0"  # prfaas-static's


@BOTH
async def test_an_answer_read_after_the_deadline_is_late_even_if_it_came(blocking: bool) -> None:
    """The read-completion rule: the deadline's clock is read when the last byte is in. A
    clock that jumps while the service answers stands for a loop too busy to fire the timer."""
    jumped = threading.Event()

    async def jump(req: dict[str, Any], w: Writer) -> None:
        jumped.set()
        w.write(response(200, ROUTE.encode()))

    with Raw(jump).running() as base:
        dec = Decider.for_spec(f"{base}/route#timeout=5s")
        policy = dec.policy
        assert isinstance(policy, HttpPolicy)
        policy.clock = lambda: time.monotonic() + (60.0 if jumped.is_set() else 0.0)
        try:
            d = await ask(dec, blocking)
            jumped.clear()
            again = await ask(dec, blocking)  # the next exchange starts full, and counts
        finally:
            await dec.aclose()
    assert (d.decided_by, kind(d), d.answer_s) == ("fallback", "late", None)
    why = d.fallback_reason or ""
    assert why.startswith("late: answer read ") and why.endswith("after the 5000ms deadline")
    assert again.decided_by == "fallback"  # the clock jumped again during its answer


async def test_a_busy_loop_turns_an_in_time_answer_late() -> None:
    """The service answers at once, but first blocks the client's event loop past the deadline
    (as a router busy with other work would be): the answer sits in the socket while the timer
    cannot fire. Whichever of the two runs first after, the decision is late."""
    client_loop = asyncio.get_running_loop()
    block = [False]

    async def busy(req: dict[str, Any], w: Writer) -> None:
        if block[0]:
            done = threading.Event()
            client_loop.call_soon_threadsafe(lambda: (done.set(), time.sleep(0.3)))
            done.wait(BOUND_S)  # the client's loop is blocked now
        w.write(response(200, ROUTE.encode()))

    with Raw(busy).running() as base:
        dec = Decider.for_spec(f"{base}/route#timeout=100ms")
        try:
            assert (await dec.adecide(VIEW, snap())).decided_by == "policy"  # warm connection
            block[0] = True
            d = await dec.adecide(VIEW, snap())
        finally:
            await dec.aclose()
    assert (d.decided_by, kind(d), d.answer_s) == ("fallback", "late", None)


# ------------------------------------------------------------------ size cap, redirects


async def claims_too_much(req: dict[str, Any], w: Writer) -> None:
    """Content-Length over the cap, then silence: only the header can say it is too large."""
    w.write(response(200, b"", Content_Length=MAX_ANSWER_BYTES + 1))
    await asyncio.sleep(BOUND_S)


async def endless_chunks(req: dict[str, Any], w: Writer) -> None:
    w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"%x\r\n%s\r\n" % (65536, b" " * 65536)
    with contextlib.suppress(ConnectionError):
        for _ in range(10_000):  # 640 MiB, far more than anyone should read
            w.write(chunk)
            await w.drain()


@BOTH
@pytest.mark.parametrize("handler", [claims_too_much, endless_chunks],
                         ids=["content-length", "endless-chunked"])  # fmt: skip
async def test_an_answer_over_the_cap_is_garbage_too_large(
    blocking: bool, handler: Handler
) -> None:
    with Raw(handler).running() as base:
        dec = Decider.for_spec(f"{base}/route#timeout=8s")
        tracemalloc.start()
        try:
            d = await ask(dec, blocking)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            await dec.aclose()
    assert (d.decided_by, kind(d)) == ("fallback", "garbage"), d.fallback_reason
    assert "too large" in (d.fallback_reason or "")
    assert d.answer_s is None
    assert peak < 8 * MAX_ANSWER_BYTES  # read no further than the cap (the service sends GBs)


@BOTH
async def test_a_redirect_is_not_followed(blocking: bool) -> None:
    with serve(example_app()) as good:
        target = f"{good}/route"

        async def moved(req: dict[str, Any], w: Writer) -> None:
            w.write(response(307, b"", Location=target))

        with Raw(moved).running() as base:
            dec = Decider.for_spec(f"{base}/route#timeout=5s")
            try:
                d = await ask(dec, blocking)
            finally:
                await dec.aclose()
    assert (d.decided_by, d.fallback_reason) == ("fallback", "status: HTTP 307")
    assert d.answer_s is not None  # an answer read in time, that was no route


# ------------------------------------------------------------------ total deadlines


async def trickle(req: dict[str, Any], w: Writer) -> None:
    """Headers, then one byte of a 1,000-byte body every 15 ms (15 s in all): all blanks, so
    a client that read it all would say `garbage`, not `late`."""
    w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nContent-Type: application/json\r\n\r\n")
    with contextlib.suppress(ConnectionError):
        for _ in range(1000):
            w.write(b" ")
            await w.drain()
            await asyncio.sleep(0.015)


@BOTH
async def test_a_trickling_service_cannot_hold_a_decision_past_its_deadline(
    blocking: bool,
) -> None:
    with Raw(trickle).running() as base:
        dec = Decider.for_spec(f"{base}/route#timeout=150ms")
        try:
            d = await ask(dec, blocking)
        finally:
            await dec.aclose()
    assert (d.decided_by, kind(d)) == ("fallback", "late"), d.fallback_reason


def test_the_feedback_worker_bounds_each_post_in_time_and_size() -> None:
    """The first /feedback answer is endless, the second trickles: the worker gives up on
    each (the size cap, the total deadline) and posts the third."""
    handlers = [endless_chunks, trickle]

    async def feedback(req: dict[str, Any], w: Writer) -> None:
        if req["path"] == "/feedback" and handlers:
            await handlers.pop(0)(req, w)
        else:
            w.write(response(200, b"{}"))

    svc = Raw(feedback)
    with svc.running() as base:
        dec = Decider.for_spec(f"{base}/route")  # 20 ms: a post's deadline is 1 s
        out = Outcome("completed", "prfaas", "p1", "d0", 1.0, 2.0, None, "policy")
        for i in range(3):
            dec.on_complete(RequestView(f"q{i}", 10, 10), out)
        deadline = time.monotonic() + BOUND_S * 2
        while len(svc.seen) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        dec.close()
    assert [r["body"]["request"]["id"] for r in svc.seen] == ["q0", "q1", "q2"]


def test_feedback_carries_the_router_id_of_the_lane_that_decided() -> None:
    svc = Raw(answer_ok)
    with svc.running() as base:
        dec = Decider.for_spec(f"{base}/route#timeout=5s")
        assert dec.decide(VIEW, snap()).decided_by == "policy"
        dec.on_complete(VIEW, Outcome("completed", "prfaas", "p1", "d0", 1.0, 2.0, None, "policy"))
        deadline = time.monotonic() + BOUND_S
        while len(svc.seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        dec.close()
    assert svc.seen[1]["path"] == "/feedback"
    assert svc.seen[1]["body"]["router"] == svc.seen[0]["body"]["router"]
