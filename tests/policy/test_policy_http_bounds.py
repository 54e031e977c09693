"""#33 defect 5: one rule bounds every exchange with a policy service, on every path (the sim's
blocking decision, the live router's aiohttp decision, the /feedback worker's posts on both): a
total deadline, the size cap on every body read, bodies read as sent (never decompressed), no
redirect followed; a failed feedback post is counted by kind, and closing the policy stops the
feedback worker even when a service holds it.

Each test bounds its own wait (a thread joined with a timeout, or asyncio.timeout), so a
regression fails instead of hanging the suite."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from testbed.policy import POLICIES
from testbed.policy.base import RequestView
from testbed.policy.decider import Decider, Decision
from testbed.policy.http import HttpPolicy
from testbed.policy.http_client import MAX_ANSWER_BYTES, REQUEST_HEADERS, feedback_deadline_s
from testbed.policy.protocol import Outcome
from tests.policy.test_policy_http_lanes import (
    BOTH,
    BOUND_S,
    ROUTE,
    VIEW,
    Raw,
    Writer,
    ask,
    kind,
    response,
    snap,
)

OUT = Outcome("completed", "prfaas", "p1", "d0", 1.0, 2.0, None, "policy")


@pytest.fixture(autouse=True)
def _forget_policy_urls() -> Iterator[None]:
    yield
    POLICIES.forget_plugins()


def bounded(fn: Callable[[], Any]) -> Any:
    """`fn()` in a daemon thread, waited for BOUND_S at most: a hang fails the test."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the test
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(BOUND_S)
    assert not t.is_alive(), f"still running after {BOUND_S:g}s"
    if "error" in box:
        raise box["error"]
    return box["value"]


async def decide_bounded(dec: Decider, blocking: bool) -> Decision:
    if blocking:
        return bounded(lambda: dec.decide(VIEW, snap()))
    async with asyncio.timeout(BOUND_S):
        return await ask(dec, blocking)


# ------------------------------------------------------------------ hostile services


async def dribble_forever(req: dict[str, Any], w: Writer) -> None:
    """A status line and headers, then one byte every 15 ms, for as long as anyone reads
    (bounded here at 100 s: far past every deadline)."""
    w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n")
    with contextlib.suppress(ConnectionError):
        for _ in range(6_000):
            w.write(b" ")
            await w.drain()
            await asyncio.sleep(0.015)


async def endless_until_close(req: dict[str, Any], w: Writer) -> None:
    """No Content-Length, not chunked: a body that ends when the connection does, which it
    does not (bounded here at 640 MiB)."""
    w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n")
    blob = b" " * 65536
    with contextlib.suppress(ConnectionError):
        for _ in range(10_000):
            w.write(blob)
            await w.drain()


async def gzipped_route(req: dict[str, Any], w: Writer) -> None:
    """A valid route, gzipped whatever the client asked for (a proxy in front may do this)."""
    body = gzip.compress(ROUTE.encode())
    w.write(response(200, body, Content_Encoding="gzip"))


# ------------------------------------------------------------------ decisions


@BOTH
@pytest.mark.parametrize(("handler", "want"), [(dribble_forever, "late"),
                                               (endless_until_close, "garbage")],
                         ids=["dribbling", "endless"])  # fmt: skip
async def test_a_hostile_answer_ends_the_decision_in_its_deadline(
    blocking: bool, handler: Any, want: str
) -> None:
    """The issue's services: a byte every 15 ms forever (`late` at the 100 ms deadline, never
    the whole run held), and an endless body (refused at the cap: `garbage: too large`)."""
    with Raw(handler).running() as base:
        dec = Decider.for_spec(f"{base}/route#timeout=100ms")
        try:
            d = await decide_bounded(dec, blocking)
        finally:
            await dec.aclose()
    assert (d.decided_by, kind(d)) == ("fallback", want), d.fallback_reason
    if want == "garbage":
        assert "too large" in (d.fallback_reason or "")
    assert d.route.prefill_instance == "p0"  # prfaas-static's


@BOTH
async def test_a_redirect_is_not_followed_and_its_target_gets_nothing(blocking: bool) -> None:
    target = Raw(lambda req, w: _answer(w))
    with target.running() as other:

        async def moved(req: dict[str, Any], w: Writer) -> None:
            w.write(response(302, b"", Location=f"{other}{req['path']}"))

        with Raw(moved).running() as base:
            dec = Decider.for_spec(f"{base}/route#timeout=5s")
            try:
                d = await decide_bounded(dec, blocking)
            finally:
                await dec.aclose()
    assert (d.decided_by, d.fallback_reason) == ("fallback", "status: HTTP 302")
    assert target.seen == []  # the snapshot never went to the redirect's target


async def _answer(w: Writer) -> None:
    w.write(response(200, ROUTE.encode()))


@BOTH
async def test_an_answer_is_read_as_sent_on_both_clients(blocking: bool) -> None:
    """Both clients ask for `identity` and never decompress: a gzipped answer is what it is
    on the wire, not JSON, on the sim as live (the live client used to inflate it)."""
    assert REQUEST_HEADERS["Accept-Encoding"] == "identity"
    with Raw(gzipped_route).running() as base:
        dec = Decider.for_spec(f"{base}/route#timeout=5s")
        try:
            d = await decide_bounded(dec, blocking)
        finally:
            await dec.aclose()
    assert (d.decided_by, kind(d)) == ("fallback", "garbage"), d.fallback_reason


# ------------------------------------------------------------------ feedback


def _policy(dec: Decider) -> HttpPolicy:
    assert isinstance(dec.policy, HttpPolicy)
    return dec.policy


def _wait(cond: Callable[[], bool]) -> None:
    deadline = time.monotonic() + BOUND_S * 2
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.02)


def test_feedback_failures_are_counted_by_kind_and_no_redirect_is_followed() -> None:
    """/feedback answers: an endless body, a 302 to a second service, a dribble, then 200: each
    bounded by the decisions' rule, counted by kind, the 302's target never asked."""
    target = Raw(lambda req, w: _answer(w))
    with target.running() as other:

        async def moved(req: dict[str, Any], w: Writer) -> None:
            w.write(response(302, b"", Location=f"{other}/feedback"))

        handlers = [endless_until_close, moved, dribble_forever]

        async def feedback(req: dict[str, Any], w: Writer) -> None:
            if handlers:
                await handlers.pop(0)(req, w)
            else:
                w.write(response(200, b"{}"))

        svc = Raw(feedback)
        with svc.running() as base:
            dec = Decider.for_spec(f"{base}/route")  # 20 ms: a post's deadline is 1 s
            assert feedback_deadline_s(0.020) == 1.0
            policy = _policy(dec)
            for i in range(4):
                dec.on_complete(RequestView(f"q{i}", 10, 10), OUT)
            _wait(lambda: policy.feedback_posted + sum(policy.feedback_failed.values()) >= 4)
            bounded(dec.close)
    assert policy.feedback_stats() == {
        "posted": 1,
        "failed": {"garbage": 1, "late": 1, "status": 1},
        "dropped": 0,
    }
    assert target.seen == []


def test_closing_stops_a_feedback_worker_a_dribbling_service_holds() -> None:
    """Every /feedback answer dribbles: each post takes its whole 1 s deadline, so a full
    queue is minutes of work. Closing stops the worker after the post it is in; what was left
    counts as dropped (it used to post on, one a second, after the run had ended)."""
    svc = Raw(dribble_forever)
    with svc.running() as base:
        dec = Decider.for_spec(f"{base}/route")
        policy = _policy(dec)
        for i in range(20):
            dec.on_complete(RequestView(f"q{i}", 10, 10), OUT)
        _wait(lambda: len(svc.seen) >= 1)
        bounded(dec.close)
        feeder = policy._feeder
        assert feeder is not None
        feeder.join(BOUND_S)
        assert not feeder.is_alive(), "the feedback worker outlived close()"
        stats = policy.feedback_stats()
    assert stats["posted"] == 0 and stats["failed"].get("late", 0) >= 1
    assert stats["failed"]["late"] + stats["dropped"] == 20
    assert len(svc.seen) < 20


def test_a_feedback_answer_over_the_cap_is_refused_at_the_cap() -> None:
    """A Content-Length over the cap: refused before its body (`garbage`), nothing read."""

    async def claims(req: dict[str, Any], w: Writer) -> None:
        w.write(response(200, b"", Content_Length=MAX_ANSWER_BYTES + 1))

    svc = Raw(claims)
    with svc.running() as base:
        dec = Decider.for_spec(f"{base}/route")
        policy = _policy(dec)
        dec.on_complete(VIEW, OUT)
        _wait(lambda: sum(policy.feedback_failed.values()) >= 1)
        bounded(dec.close)
    assert policy.feedback_stats()["failed"] == {"garbage": 1}
