"""#30 defect 4: the snapshot's link view is measured for every policy that reads it, whatever
its fallback (prfaas-static here, which runs no scheduler loop of its own); null where nothing
was measured, never negative. An answer's `route.threshold_tokens` is the policy's threshold
in summary.json, report.md and the timeline, the fallback's labelled apart.

bandwidth-drop on the sim, 130 s of its arrivals: the link drops from 100 to 5 Gbps at 60 s
for 60 s. Seed 26 puts four arrivals before the short-term loop's first sample (at 1 s)."""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from statistics import median
from typing import Any

import pytest
from aiohttp import web
from servers import PROMPT, serve

from testbed.metrics.thresholds import threshold_lines
from testbed.metrics.timeline import write_timeline
from testbed.policy import POLICIES, get_policy
from testbed.policy.base import LinkView, measures_link
from testbed.policy.decider import plugin_fallback
from testbed.policy.protocol import (
    PROTOCOL,
    ProtocolError,
    Resync,
    SnapshotMirror,
    decode_request,
    decode_route,
    encode_route,
    snapshot_from_doc,
)
from testbed.policy.static import PrfaasStatic
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.schema import load_scenario
from testbed.scenario.sim_run import run_sim

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "testbed" / "library" / "bandwidth-drop.yaml"
DURATION_S = 130.0
SEED = 26
BEFORE = (20.0, 60.0)
"""Steady load on the full link (the estimator has long been warm)."""
DURING = (75.0, 120.0)
"""The drop, once the senders' queue stands in front of the narrow link."""
GBPS = 1e9 / 8
RECORDER = '''\
from typing import ClassVar

from testbed.policy.static import PrfaasStatic


class LinkRecorder(PrfaasStatic):
    """prfaas-static's routes, from outside the project, recording every link view."""

    name: ClassVar[str] = "link-recorder"
    link_view: ClassVar[bool] = {link_view}
    seen: ClassVar[list] = []

    def decide(self, request, snapshot):
        self.seen.append((snapshot.now, snapshot.link))
        return super().decide(request, snapshot)
'''


@pytest.fixture(autouse=True)
def _forget_plugins() -> Iterator[None]:
    yield
    POLICIES.forget_plugins()


def _run(policy: str, out: Path, duration_s: float = DURATION_S) -> Any:
    opts = RunOptions(substrate="sim", out_dir=out, policy=policy, duration_s=duration_s,
                      seed=SEED, progress=False)  # fmt: skip
    return run_sim(prepare_run(load_scenario(SCENARIO), opts), opts)


def _recorder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, link_view: bool) -> Any:
    module = f"linkrec_{str(link_view).lower()}"
    (tmp_path / f"{module}.py").write_text(RECORDER.format(link_view=link_view))
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module(module)


def _window(seen: list[tuple[float, LinkView]], span: tuple[float, float]) -> list[LinkView]:
    return [link for t, link in seen if span[0] <= t < span[1]]


def _never_negative(views: list[LinkView]) -> None:
    for v in views:
        for x in (v.bandwidth_bps, v.in_flight_bytes, v.delivered_bps):
            assert x is None or (math.isfinite(x) and x >= 0.0), v


def test_a_plugin_that_asks_sees_the_link_whatever_its_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mod = _recorder(tmp_path, monkeypatch, link_view=True)
    spec = f"{mod.__name__}:LinkRecorder"
    cls = get_policy(spec)
    assert plugin_fallback(cls) == "prfaas-static" and not cls.replans and measures_link(cls)
    result = _run(spec, tmp_path / "out")
    seen: list[tuple[float, LinkView]] = mod.LinkRecorder.seen
    assert result.summary["decisions"]["by"] == {"policy": len(seen), "fallback": 0}
    views = [link for _, link in seen]
    assert all(v is not None for v in views)
    _never_negative(views)
    # before the loop's first sample (every 1 s) nothing was measured: null, not an idle link
    cold = [v for t, v in seen if t < 1.0]
    assert cold and all(v.in_flight_bytes is None and v.bandwidth_bps is None for v in cold)
    before, during = _window(seen, BEFORE), _window(seen, DURING)
    bw_before = [v.bandwidth_bps for v in before if v.bandwidth_bps is not None]
    bw_during = [v.bandwidth_bps for v in during if v.bandwidth_bps is not None]
    assert len(bw_before) == len(before) > 10 and len(bw_during) == len(during) > 10
    assert median(bw_during) < 0.5 * median(bw_before)  # the estimate follows the drop
    assert median(bw_during) < 20 * GBPS
    # the narrow link is saturated: KV stands in front of it
    flying = [v.in_flight_bytes for v in during]
    assert sum(1 for x in flying if x is not None and x > 0) >= 0.9 * len(flying)


def test_a_plugin_that_does_not_ask_runs_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No link view declared, no re-planning: no loop runs, and the link view says so (null,
    where it used to say 0 bytes in flight); the routes are prfaas-static's, byte for byte."""
    mod = _recorder(tmp_path, monkeypatch, link_view=False)
    spec = f"{mod.__name__}:LinkRecorder"
    assert not measures_link(get_policy(spec))
    _run(spec, tmp_path / "plugin", duration_s=70.0)
    _run("prfaas-static", tmp_path / "static", duration_s=70.0)
    views = [link for _, link in mod.LinkRecorder.seen]
    assert views and all(
        (v.bandwidth_bps, v.in_flight_bytes, v.delivered_bps) == (None, None, None) for v in views
    )

    def routes(out: Path) -> list[tuple[Any, ...]]:
        recs = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
        return [(r["id"], r["prefill_instance"], r["decode_instance"], r["first_token"])
                for r in recs]  # fmt: skip

    assert routes(tmp_path / "plugin") == routes(tmp_path / "static")


class ThresholdService:
    """prfaas-static behind HTTP, routing by 0.8 x the snapshot's threshold and saying so
    (`route.threshold_tokens`); it records the link of every snapshot it is sent. Its first
    answer is an HTTP 500, so one decision is the fallback's."""

    FACTOR = 0.8

    def __init__(self) -> None:
        self.mirror = SnapshotMirror()
        self.links: list[tuple[float, dict[str, Any] | None]] = []
        self.asked = 0

    async def route(self, request: web.Request) -> web.Response:
        doc = await request.json()
        self.asked += 1
        if self.asked == 1:
            return web.Response(status=500)
        snap = doc["snapshot"]
        try:
            rows = self.mirror.apply(snap)
        except Resync:
            return web.Response(status=409)
        self.links.append((snap["now"], snap["link"]))
        view = snapshot_from_doc(snap, rows, self.mirror.costs)
        t = view.threshold_tokens * self.FACTOR
        try:
            route = PrfaasStatic().decide(
                decode_request(doc["request"]), replace(view, threshold_tokens=t)
            )
        except LookupError:
            return web.Response(status=503)
        body = {"protocol": PROTOCOL, "route": {**encode_route(route), "threshold_tokens": t}}
        return web.json_response(body)

    async def feedback(self, _request: web.Request) -> web.Response:
        return web.json_response({})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/route", self.route)
        app.router.add_post("/feedback", self.feedback)
        return app


def test_an_http_policy_sees_the_link_and_reports_its_own_threshold(tmp_path: Path) -> None:
    service = ThresholdService()
    with serve(service.app()) as base:
        result = _run(f"{base}/route#{PROMPT}", tmp_path)  # default fallback: prfaas-static
    dec = result.summary["decisions"]
    assert dec["by"]["fallback"] == 1 and dec["by"]["policy"] == len(service.links)
    # (a) the link view, on the wire: null before the first sample, then measured
    links = [(t, LinkView(**doc)) for t, doc in service.links if doc is not None]
    assert len(links) == len(service.links)
    _never_negative([v for _, v in links])
    assert links[0][0] < 1.0 and links[0][1].in_flight_bytes is None
    during = _window(links, DURING)
    bw_before = median(v.bandwidth_bps for v in _window(links, BEFORE) if v.bandwidth_bps)
    assert median(v.bandwidth_bps for v in during if v.bandwidth_bps) < 0.5 * bw_before
    assert sum(1 for v in during if (v.in_flight_bytes or 0) > 0) >= 0.9 * len(during)
    # (b) the threshold the service said it routed by is the policy's; the snapshot's (the
    # planner's t, which prfaas-static routes by) is the fallback's
    loop_t = result.summary["threshold_tokens"]
    own = [r.threshold_tokens for r in result.records if r.decided_by == "policy"]
    assert own and set(own) == {loop_t * ThresholdService.FACTOR}
    thr = result.summary["policy_thresholds"]
    assert thr["last"] == thr["min"] == loop_t * ThresholdService.FACTOR
    assert thr["samples"] == len(own)
    assert thr["fallback"]["last"] == loop_t
    report = (tmp_path / "report.md").read_text()
    row = next(line for line in report.splitlines() if "policy threshold" in line)
    assert "its routes'" in row and f"{loop_t * ThresholdService.FACTOR / 1e3:.3g}K" in row
    assert "fallback threshold" in report
    lines = threshold_lines(result.records, result.history, outside=True)
    assert set(lines) == {"policy threshold", "fallback threshold"}
    assert {v for _, v in lines["policy threshold"][0]} == {loop_t * ThresholdService.FACTOR}
    assert {v for _, v in lines["fallback threshold"][0]} == {loop_t}
    png = write_timeline(tmp_path / "outside.png", result.records, result.history,
                         title="outside", outside=True)  # fmt: skip
    assert png.stat().st_size > 0


def test_an_answers_threshold_is_optional_and_checked() -> None:
    route = {"prefill_cluster": "local", "prefill_instance": "p", "decode_instance": "d",
             "uncached_tokens": 10}  # fmt: skip
    assert decode_route({"route": route}).threshold_tokens is None
    assert decode_route({"route": route}, 8000.0).threshold_tokens == 8000.0
    assert decode_route({"route": {**route, "threshold_tokens": None}}).threshold_tokens is None
    said = decode_route({"route": {**route, "threshold_tokens": 12500}}, 8000.0)
    assert said.threshold_tokens == 12500.0
    for bad in (0, -1, "9000", True, math.inf, math.nan, [1]):
        with pytest.raises(ProtocolError, match=r"^garbage: threshold_tokens"):
            decode_route({"route": {**route, "threshold_tokens": bad}})
