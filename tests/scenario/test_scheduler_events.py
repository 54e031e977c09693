"""The runner follows the router's event stream (GET /events) into the run's history: each
event on the load's clock (one conversion, LiveClock.reading), a broken stream resumed after the
last event seen without duplicates, a policy line recorded only when the inputs change, and
every event the router made before the end in the history. Against a fake router."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from testbed.clock import LiveClock
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.runner import _Run
from testbed.scenario.schema import load_scenario
from testbed.services.spec import ServiceSpec
from testbed.substrate.base import ServiceHandle

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "tiny.yaml"
K = 20.0  # the tiny scenario's time_scale


def test_reading_converts_between_clocks_of_two_epochs() -> None:
    services = LiveClock(epoch=100.0, time_scale=K)
    load = LiveClock(epoch=102.5, time_scale=K)  # the load started 2.5 wall seconds later
    assert load.reading(70.0, services) == pytest.approx(70.0 - 2.5 * K)
    assert services.reading(load.reading(33.0, services), load) == pytest.approx(33.0)


def _line(**doc: Any) -> bytes:
    return (json.dumps(doc) + "\n").encode()


async def test_the_runner_follows_resumes_dedupes_and_converts(tmp_path: Path) -> None:
    opts = RunOptions(out_dir=tmp_path, progress=False)
    run = _Run(prepare_run(load_scenario(TINY), opts), opts)
    assert run.rp.threshold_tokens == 8000
    run.service_clock = LiveClock(epoch=50.0, time_scale=K)
    run.clock = LiveClock(epoch=51.0, time_scale=K)  # load time = services' time - 20
    asked: list[str] = []
    hold = asyncio.Event()

    async def events(request: web.Request) -> web.StreamResponse:
        asked.append(request.query["after"])
        resp = web.StreamResponse()
        await resp.prepare(request)
        if len(asked) == 1:
            await resp.write(_line(seq=1, t=19.0, kind="threshold", threshold_tokens=8000.0))
            await resp.write(_line(seq=2, t=30.0, kind="drain", instance="d0"))
            # the policy in force is the one the run started with: not recorded again
            await resp.write(
                _line(seq=2, t=30.0, kind="policy", threshold_tokens=8000.0,
                      bandwidth_scarce=False, bandwidth_estimate_gbps=100.0)
            )  # fmt: skip
            return resp  # the stream breaks here: the runner resumes after seq 2
        await resp.write(_line(seq=2, t=30.0, kind="drain", instance="d0"))  # seen: skipped
        await resp.write(
            _line(seq=3, t=41.0, kind="policy", threshold_tokens=12000.0,
                  bandwidth_scarce=True, bandwidth_estimate_gbps=5.0)
        )  # fmt: skip
        await resp.write(_line(seq=4, t=45.0, kind="split", n_prefill=2))
        await hold.wait()  # stays open, as the router's does, until the runner stops reading
        return resp

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({"events_seq": 4})

    app = web.Application()
    app.router.add_get("/events", events)
    app.router.add_get("/stats", stats)
    server = TestServer(app)
    await server.start_server()
    try:
        run.router = ServiceHandle(
            spec=ServiceSpec(role="router", id="router"), url=str(server.make_url("")).rstrip("/")
        )
        async with aiohttp.ClientSession() as session:
            follower = asyncio.create_task(run._scheduler_events(session))
            async with asyncio.timeout(30):  # bounded: the end waits for seq 4 at most 5 s
                await run._end_events(session, follower)
        assert follower.done()
    finally:
        hold.set()
        await server.close()
    assert asked == ["0", "2"]
    got = [(e.t, e.kind, e.data) for e in run.history]
    assert got == [
        (pytest.approx(-1.0), "threshold", {"threshold_tokens": 8000.0}),
        (pytest.approx(10.0), "drain", {"instance": "d0"}),
        (
            pytest.approx(21.0),
            "policy",
            {"threshold_tokens": 12000.0, "bandwidth_scarce": True, "bandwidth_estimate_gbps": 5.0},
        ),
        (pytest.approx(25.0), "split", {"n_prefill": 2}),
    ]
    assert run.events_seen == 4
