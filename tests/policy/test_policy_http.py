"""#16 item 2: the HTTP policy and the one failure semantics every policy shares.

Unit level: the URL's settings, the scenario's `kind: http`, the delta snapshot (its size does
not grow with the deployment), the client against services that are slow, gone, wrong or that
lost their copy (409), feedback; and a sim run against a 50 ms service with a 20 ms timeout:
every decision falls back, nothing is lost, and summary.json and report.md say so."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from testbed.config import PolicyConfig
from testbed.policy import POLICIES, get_policy
from testbed.policy.base import InstanceLoad, RequestView, Route, Snapshot
from testbed.policy.decider import Decider, fallback_kind, route_problem
from testbed.policy.http import HttpPolicy, HttpSpec
from testbed.policy.protocol import DeltaEncoder, Outcome, SnapshotMirror
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.sim_run import run_sim
from tests.chaos.harness import chaos_variant
from tests.policy.servers import PROMPT, SERVICE_KEY, Replay, example_app, serve

ROUTE = {"prefill_cluster": "prfaas", "prefill_instance": "p1", "decode_instance": "d0",
         "uncached_tokens": 9000}  # fmt: skip


def snap(n_prefill: int = 2, now: float = 1.0) -> Snapshot:
    inst = [InstanceLoad(f"p{i}", "prfaas", "prefill", i, 100.0 * i) for i in range(n_prefill)]
    inst += [InstanceLoad("l0", "local", "prefill", 0, 0.0)]
    inst += [InstanceLoad("d0", "local", "decode", 0, 0.0)]
    return Snapshot(now, tuple(inst), threshold_tokens=8000.0)


VIEW = RequestView("q1", 9000, 100)


@pytest.fixture(autouse=True)
def _forget_policy_urls() -> Iterator[None]:
    """A policy URL registers as a plugin when first named: drop them after each test, so the
    registry's list of known names stays what other tests expect."""
    yield
    POLICIES.forget_plugins()


# ------------------------------------------------------------------ naming it


def test_the_url_carries_its_settings() -> None:
    s = HttpSpec.parse("http://127.0.0.1:9000/route")
    assert (s.timeout_s, s.fallback, s.validate, s.lanes) == (0.02, "prfaas-static", False, 8)
    s = HttpSpec.parse("http://127.0.0.1:9000/route#timeout=50ms&fallback=naive&validate=1")
    assert (s.timeout_s, s.fallback, s.validate) == (0.05, "naive", True)
    assert HttpSpec.parse("http://h:1/r#lanes=3").to_spec() == "http://h:1/r#lanes=3"
    assert HttpSpec.parse(s.to_spec()) == s
    assert s.feedback_url == "http://127.0.0.1:9000/feedback"
    for bad in ("http://h:1/r#colour=red", "http://h:1/r#timeout=0ms", "ftp://h/r",
                "http://h:1/r#fallback=http://x", "http://h:1/r#lanes=0",
                "http://h:1/r#lanes=65", "http://h:1/r#lanes=two"):  # fmt: skip
        with pytest.raises(ValueError):
            HttpSpec.parse(bad)


def test_a_policy_url_is_a_policy_with_its_fallbacks_facts() -> None:
    cls = get_policy("http://127.0.0.1:9/route#fallback=prfaas")
    assert issubclass(cls, HttpPolicy)
    fb = get_policy("prfaas")
    assert (cls.deployment_kind, cls.needs_threshold, cls.replans, cls.long_term) == (
        fb.deployment_kind, fb.needs_threshold, fb.replans, fb.long_term,
    )  # fmt: skip
    assert POLICIES.is_plugin("http://127.0.0.1:9/route#fallback=prfaas")
    assert get_policy("http://127.0.0.1:9/route").fallback_name == "prfaas-static"
    with pytest.raises(Exception, match="unknown policy 'nope'"):
        get_policy("http://127.0.0.1:9/route#fallback=nope")


def test_scenario_kind_http_names_the_policy_by_its_url() -> None:
    ctx = {"strict_units": True}
    p = PolicyConfig.model_validate(
        {"kind": "http", "url": "http://127.0.0.1:9/route", "timeout": "50ms",
         "fallback": "naive"}, context=ctx,
    )  # fmt: skip
    assert p.name == "http://127.0.0.1:9/route#timeout=50ms&fallback=naive"
    assert (
        PolicyConfig.model_validate({"kind": "http", "url": "http://h:1/r"}).name == "http://h:1/r"
    )
    with pytest.raises(ValidationError, match="has no unit"):
        PolicyConfig.model_validate({"kind": "http", "url": "http://h:1/r", "timeout": 0.02},
                                    context=ctx)  # fmt: skip
    with pytest.raises(ValidationError, match="needs url"):
        PolicyConfig.model_validate({"kind": "http"})
    with pytest.raises(ValidationError, match="only for kind: http"):
        PolicyConfig.model_validate({"url": "http://h:1/r"})
    with pytest.raises(ValidationError, match="only for kind: http"):
        PolicyConfig.model_validate({"command": ["x"]})


# ------------------------------------------------------------------ the delta snapshot


def test_a_delta_carries_what_changed_not_the_deployment() -> None:
    sizes = {}
    for n in (10, 1000):
        enc = DeltaEncoder()
        s0 = snap(n)
        full = enc.encode(s0)
        enc.commit()
        changed = (InstanceLoad("p0", "prfaas", "prefill", 5, 9.0), *s0.instances[1:-1])
        delta = enc.encode(Snapshot(2.0, changed, 8000.0))
        assert full["base"] is None and len(full["instances"]) == n + 2
        assert delta["base"] == full["version"]
        assert [r[0] for r in delta["instances"]] == ["p0"] and delta["removed"] == ["d0"]
        sizes[n] = len(json.dumps(delta))
        mirror = SnapshotMirror()
        mirror.apply(full)
        rows = mirror.apply(delta)
        assert len(rows) == n + 1 and rows["p0"][3] == 5
    assert sizes[1000] == sizes[10]


def test_a_failed_exchange_makes_the_next_snapshot_full() -> None:
    enc = DeltaEncoder()
    enc.encode(snap())
    enc.commit()
    assert enc.encode(snap())["base"] is not None
    enc.reset()
    assert enc.encode(snap())["base"] is None


# ------------------------------------------------------------------ failure semantics


class Raising:
    name = "raising"
    deployment_kind = "prfaas-pd"
    needs_threshold = True
    replans = long_term = cache_aware = False

    def __init__(self, exc: Exception | None = None, route: Any = None) -> None:
        self.exc, self.route = exc, route
        self.outcomes: list[Outcome] = []

    def decide(self, request: RequestView, snapshot: Snapshot) -> Route:
        if self.exc is not None:
            raise self.exc
        return self.route  # type: ignore[no-any-return]

    def on_complete(self, request: RequestView, outcome: Outcome) -> None:
        self.outcomes.append(outcome)


def fallback() -> Any:
    return POLICIES["prfaas-static"]()


def test_lookup_error_is_no_route_yet_and_anything_else_falls_back() -> None:
    with pytest.raises(LookupError):
        Decider(Raising(LookupError("none")), fallback()).decide(VIEW, snap())
    d = Decider(Raising(ZeroDivisionError("x")), fallback()).decide(VIEW, snap())
    assert (d.decided_by, fallback_kind(d.fallback_reason)) == ("fallback", "error")
    assert d.route.prefill_instance == "p0" and "ZeroDivisionError" in (d.fallback_reason or "")
    d = Decider(Raising(route="p1"), fallback()).decide(VIEW, snap())
    assert fallback_kind(d.fallback_reason) == "garbage"
    ok = Route("prfaas", "p1", "d0", 9000)
    d = Decider(Raising(route=ok), fallback()).decide(VIEW, snap())
    assert (d.decided_by, d.route, d.fallback_reason) == ("policy", ok, None)


def test_impossible_routes_are_named() -> None:
    s = snap()
    assert route_problem(Route("prfaas", "p9", "d0", 1), s).startswith("unknown-instance")  # type: ignore[union-attr]
    assert route_problem(Route("prfaas", "p1", "p0", 1), s).startswith("wrong-role")  # type: ignore[union-attr]
    assert route_problem(Route("local", "p1", "d0", 1), s).startswith("wrong-cluster")  # type: ignore[union-attr]

    class Draining:  # an instance whose state is not ok (the richer snapshot's `state`)
        id, cluster, role, outstanding, outstanding_work, state = (
            "p1",
            "prfaas",
            "prefill",
            0,
            0.0,
            "draining",
        )

    s2 = Snapshot(1.0, (Draining(), *s.instances[2:]), 8000.0)  # type: ignore[arg-type]
    assert route_problem(Route("prfaas", "p1", "d0", 1), s2).startswith("not-ok")  # type: ignore[union-attr]


def test_a_builtin_policy_keeps_its_own_behaviour() -> None:
    dec = Decider.for_spec("prfaas-static")
    assert dec.fallback is None
    with pytest.raises(ValueError, match="needs a threshold"):
        dec.decide(VIEW, Snapshot(1.0, snap().instances, None))


def test_feedback_reaches_a_python_policy() -> None:
    p = Raising(route=Route("prfaas", "p1", "d0", 9000))
    out = Outcome("completed", "prfaas", "p1", "d0", 1.0, 2.0, None, "policy")
    Decider(p, fallback()).on_complete(VIEW, out)
    assert p.outcomes == [out]


# ------------------------------------------------------------------ over HTTP


@pytest.mark.parametrize("blocking", [True, False], ids=["sim-client", "live-client"])
async def test_a_slow_service_falls_back_within_the_timeout(blocking: bool) -> None:
    replay = Replay(200, json.dumps({"route": ROUTE}), delay_s=0.05)
    with serve(replay.app()) as base:
        dec = Decider.for_spec(f"{base}/route")  # default timeout 20ms
        try:
            for _ in range(3):
                d = dec.decide(VIEW, snap()) if blocking else await dec.adecide(VIEW, snap())
                assert d.decided_by == "fallback" and fallback_kind(d.fallback_reason) == "late"
                assert d.route.prefill_instance == "p0"  # prfaas-static: least loaded PrfaaS
        finally:
            await dec.aclose()
        # a request the client gave up on may land after it did (or, on a loaded machine,
        # never leave it within 20 ms): wait a bounded time for the ones on their way
        deadline = time.monotonic() + 2.0
        while len(replay.seen) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert 1 <= len(replay.seen) <= 3
        assert all(doc["snapshot"]["base"] is None for doc in replay.seen)  # no ack: full again


@pytest.mark.parametrize("blocking", [True, False], ids=["sim-client", "live-client"])
async def test_a_good_service_decides_with_deltas_and_resyncs(blocking: bool) -> None:
    app = example_app()
    with serve(app) as base:
        dec = Decider.for_spec(f"{base}/route#{PROMPT}&validate=1")
        policy = dec.policy
        assert isinstance(policy, HttpPolicy)

        async def ask() -> Any:
            return dec.decide(VIEW, snap()) if blocking else await dec.adecide(VIEW, snap())

        try:
            assert (await ask()).decided_by == "policy"
            assert (await ask()).decided_by == "policy"
            app[SERVICE_KEY].mirrors.clear()  # the service restarted: its copy is gone
            d = await ask()
            assert d.decided_by == "policy" and policy.resyncs == 1
        finally:
            await dec.aclose()
        assert app[SERVICE_KEY].decisions == 3


def test_an_unreachable_service_falls_back() -> None:
    with serve(Replay().app()) as base:
        pass  # the port is free again
    dec = Decider.for_spec(f"{base}/route")
    d = dec.decide(VIEW, snap())
    assert fallback_kind(d.fallback_reason) in ("unreachable", "late")
    dec.close()


def test_feedback_is_posted_fire_and_forget() -> None:
    replay = Replay(200, json.dumps({"route": ROUTE}))
    with serve(replay.app()) as base:
        dec = Decider.for_spec(f"{base}/route#{PROMPT}")
        out = Outcome("failed", "prfaas", "p1", "d0", None, None, "boom", "policy")
        dec.on_complete(VIEW, out)
        for _ in range(1000):  # up to 10 s: the post leaves from a thread, under xdist load
            if replay.feedback:
                break
            time.sleep(0.01)
        dec.close()
    assert replay.feedback[0]["outcome"]["failure_reason"] == "boom"


# ------------------------------------------------------------------ a whole run (sim)


def test_sim_run_against_a_slow_service_falls_back_every_time(tmp_path: Path) -> None:
    replay = Replay(200, json.dumps({"route": ROUTE}), delay_s=0.05)
    with serve(replay.app()) as base:
        sc = chaos_variant("burst", duration=20.0)
        opts = RunOptions(substrate="sim", out_dir=tmp_path, policy=f"{base}/route",
                          drain_timeout_s=30)  # fmt: skip
        result = run_sim(prepare_run(sc, opts), opts)
    req, dec = result.summary["requests"], result.summary["decisions"]
    assert req["submitted"] == req["completed"] > 0 and req["failed"] == 0
    assert dec["by"] == {"policy": 0, "fallback": req["submitted"]}
    assert dec["fallback_reasons"] == {"late": req["submitted"]}
    assert dec["latency_wall_ms"]["p50"] >= 20.0
    report = (tmp_path / "report.md").read_text()
    assert f"0 routed by the policy, {req['submitted']} by the fallback" in report
    assert "| late |" in report
    recs = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert {(r["decided_by"], r["fallback_reason"].split(":")[0]) for r in recs} == {
        ("fallback", "late")
    }


def test_both_forms_of_the_example_route_alike_on_the_sim(tmp_path: Path) -> None:
    """The plugin and the service, with the fallback whose facts match the plugin's
    (prfaas-nolongterm: short-term loop, cache-aware, no role switching), give the same run."""
    sc = chaos_variant("bandwidth-drop")
    runs = {}
    with serve(example_app()) as base:
        for form, spec in (
            ("plugin", "least_ttft.plugin:LeastTTFT"),
            ("http", f"{base}/route#{PROMPT}&fallback=prfaas-nolongterm"),
        ):
            opts = RunOptions(substrate="sim", out_dir=tmp_path / form, policy=spec,
                              drain_timeout_s=30)  # fmt: skip
            result = run_sim(prepare_run(sc, opts), opts)
            runs[form] = [
                (r.id, r.prefill_instance, r.decode_instance, r.first_token, r.decided_by)
                for r in result.records
            ]
    assert runs["plugin"] == runs["http"]
    assert {r[4] for r in runs["http"]} == {"policy"}


def test_a_plugin_falls_back_to_a_policy_its_run_can_serve() -> None:
    from testbed.policy.decider import plugin_fallback

    class NoThreshold(Raising):
        needs_threshold = False

    class Homog(NoThreshold):
        deployment_kind = "homogeneous"

    assert plugin_fallback(Raising) == "prfaas-static"  # type: ignore[arg-type]
    assert plugin_fallback(NoThreshold) == "naive"  # type: ignore[arg-type]
    assert plugin_fallback(Homog) == "homogeneous"  # type: ignore[arg-type]
    # without a threshold in the snapshot the fallback still decides
    dec = Decider(NoThreshold(ZeroDivisionError()), POLICIES[plugin_fallback(NoThreshold)]())  # type: ignore[arg-type]
    d = dec.decide(VIEW, Snapshot(1.0, snap().instances, None))
    assert d.decided_by == "fallback" and d.route.prefill_cluster == "prfaas"
