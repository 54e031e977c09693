"""`GET /events` on the router (services.router.follow): the scheduler's decisions replayed and
then streamed as they happen, policy changes as they happen, a resume point, and an end when
the router stops. In-process (aiohttp test server)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from testbed.services.router.api import create_app
from testbed.services.router.intake import STATE
from testbed.services.spec import ServiceSpec


async def _lines(resp: Any, n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    async with asyncio.timeout(10):  # a hang is the bug: bounded, not a speed claim
        while len(out) < n:
            line = await resp.content.readline()
            assert line, f"stream ended after {out}"
            out.append(json.loads(line))
    return out


async def test_events_replay_then_follow_with_policy_changes() -> None:
    app, _ = await create_app(
        ServiceSpec(role="router", id="r", policy="prfaas-static", threshold_tokens=8000)
    )
    async with TestClient(TestServer(app)) as client:
        sched = app[STATE].scheduler
        sched.record("threshold", threshold_tokens=8000.0, why="start")
        sched.record("split_check", act=False)
        resp = await client.get("/events")
        assert resp.status == 200 and resp.content_type == "application/x-ndjson"
        first = await _lines(resp, 3)
        assert [(d["seq"], d["kind"]) for d in first] == [
            (1, "threshold"),
            (2, "split_check"),
            (2, "policy"),  # the inputs in force when the reader joined
        ]
        assert first[0]["why"] == "start" and isinstance(first[0]["t"], float)
        assert first[2]["threshold_tokens"] == 8000 and first[2]["bandwidth_scarce"] is False
        sched.set_policy(9000.0, True)
        sched.set_policy(9000.0, True)  # no change: no line
        sched.record("split", n_prefill=3)
        live = await _lines(resp, 2)
        assert [(d["seq"], d["kind"]) for d in live] == [(3, "policy"), (4, "split")]
        assert live[0]["threshold_tokens"] == 9000 and live[0]["bandwidth_scarce"] is True
        resp.close()

        resumed = await client.get("/events", params={"after": 2})
        again = await _lines(resumed, 2)
        assert [(d["seq"], d["kind"]) for d in again] == [(4, "split"), (4, "policy")]
        resumed.close()
        stats = await (await client.get("/stats")).json()
        assert stats["events_seq"] == 4


async def test_a_bad_resume_point_is_a_400() -> None:
    app, _ = await create_app(ServiceSpec(role="router", id="r"))
    async with TestClient(TestServer(app)) as client:
        for bad in ("-1", "x", "1.5", "9" * 30):
            resp = await client.get("/events", params={"after": bad})
            assert resp.status == 400, bad
            doc = await resp.json()
            assert "after" in doc["error"]["message"]


async def test_the_stream_ends_when_the_router_stops() -> None:
    app, _ = await create_app(ServiceSpec(role="router", id="r"))
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        resp = await client.get("/events")
        (policy,) = await _lines(resp, 1)
        assert policy["kind"] == "policy" and policy["threshold_tokens"] is None
        closing = asyncio.create_task(client.server.close())
        async with asyncio.timeout(10):
            rest = await resp.content.read()  # EOF once the router ends the stream
        assert rest == b""
        await closing
    finally:
        await client.close()
