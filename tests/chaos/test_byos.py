"""#16 items 4 and 6: an outside scheduler on live processes.

The example scheduler (examples/least-ttft) runs every short scenario of the chaos suite in both
of its forms, the Python plugin and the HTTP service, each (scenario, form) pair once: four
live (`LIVE_FORMS`: burst, the main scenario, over HTTP; a link fault, bandwidth-drop, as a
plugin; a prefill crash as a plugin and a decode crash over HTTP) and every other pair on the
sim (#31: the live runs were half of `make chaos`; what a fault does to the example's decisions
is the same program on the sim, and test_library.py runs every scenario live with the built-in
policies).
The live form exercises the router's side of the form (the aiohttp client, the plugin loaded
in the router process); the sim form the blocking client and the same Decider. A scenario that
owns the service (`policy.command`) kills, pauses and slows it mid-run: nothing is lost, and the
fallback takes over within the timeout (the `fallback` checker)."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from testbed.scenario.plan import RunResult
from testbed.scenario.schema import Scenario
from tests.chaos.harness import (
    LIBRARY,
    TORCH_SCENARIOS,
    chaos_variant,
    run_sim_variant,
    run_variant,
)
from tests.policy.servers import EXAMPLE, Replay, example_app, serve

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]

INVARIANTS = {"nothing_lost", "kv_accounted", "no_unverified_decode", "generator_count"}
TIMEOUT = "100ms"
"""The decision timeout in these runs: above the loaded test machine's decision latency (a
few ms, with tails of tens), so the fallback decides only when the service is in trouble."""


@pytest.fixture(autouse=True)
def example_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The router process (and an owned service) import the example from the tree."""
    monkeypatch.setenv("PYTHONPATH", f"{EXAMPLE}:{Path(__file__).resolve().parents[2]}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def with_changes(sc: Scenario, **changes: Any) -> Scenario:
    doc = sc.model_dump(by_alias=True, exclude_none=True)
    doc.update(changes)
    return Scenario.model_validate(doc)


SCENARIOS = [n for n in LIBRARY if n not in TORCH_SCENARIOS]
LIVE_FORMS = {
    "burst": "http",
    "bandwidth-drop": "plugin",
    "prefill-crash": "plugin",
    "decode-crash": "http",
}
"""The pairs that run live: both forms, a link fault and both crashes (the router's side of each
form, the aiohttp client and the plugin loaded in the router process, under a fault)."""
LIVE = list(LIVE_FORMS)
FORMS = LIVE_FORMS
OTHER = {"plugin": "http", "http": "plugin"}
PLUGIN = "least_ttft.plugin:LeastTTFT"
SIM_PAIRS = [(n, OTHER[FORMS[n]]) for n in LIVE] + [
    (n, form) for n in SCENARIOS if n not in LIVE_FORMS for form in ("plugin", "http")
]


def test_every_pair_runs_in_one_leg() -> None:
    live = {(n, FORMS[n]) for n in LIVE}
    sim = set(SIM_PAIRS)
    assert live | sim == {(n, f) for n in SCENARIOS for f in ("plugin", "http")}
    assert not live & sim and len(SIM_PAIRS) == len(sim)
    assert set(FORMS.values()) == {"plugin", "http"}  # both forms run live somewhere


def assert_example_decided(result: RunResult) -> None:
    verdicts = {c.name: (c.verdict, c.detail) for c in result.checks}
    for inv in INVARIANTS:  # the scenario's own bounds are the scorecard's to judge
        assert verdicts[inv][0] == "ok", (inv, verdicts[inv])
    dec = result.summary["decisions"]
    assert dec["routed"] > 0
    assert dec["by"]["policy"] > dec["by"]["fallback"], dec


@pytest.mark.parametrize("name", [pytest.param(n, id=f"{n}-{FORMS[n]}") for n in LIVE])
async def test_example_scheduler_runs_the_short_scenarios_live(name: str, tmp_path: Path) -> None:
    sc = chaos_variant(name)
    if FORMS[name] == "plugin":
        result = await run_variant(sc, tmp_path, policy=PLUGIN)
    else:
        with serve(example_app()) as base:
            spec = f"{base}/route#timeout={TIMEOUT}&fallback=prfaas-nolongterm"
            result = await run_variant(sc, tmp_path, policy=spec)
    assert_example_decided(result)


@pytest.mark.parametrize(
    ("name", "form"), [pytest.param(n, f, id=f"{n}-{f}") for n, f in SIM_PAIRS]
)
def test_example_scheduler_runs_the_short_scenarios_on_sim(
    name: str, form: str, tmp_path: Path
) -> None:
    """The same short scenarios on the sim: every pair that does not run live."""
    sc = chaos_variant(name)
    if form == "plugin":
        result = _sim(sc, tmp_path, PLUGIN)
    else:
        with serve(example_app()) as base:
            result = _sim(
                sc, tmp_path, f"{base}/route#timeout={TIMEOUT}&fallback=prfaas-nolongterm"
            )
    assert result.summary["substrate"] == "sim"
    assert_example_decided(result)


def _sim(sc: Scenario, out: Path, policy: str) -> RunResult:
    return run_sim_variant(sc, out, policy=policy)


def owned(sc: Scenario, nemesis: list[dict[str, Any]], checkers: list[dict[str, Any]]) -> Scenario:
    port = free_port()
    policy = {
        "kind": "http",
        "url": f"http://127.0.0.1:{port}/route",
        "timeout": TIMEOUT,
        "command": [sys.executable, "-m", "least_ttft.server", "--port", str(port)],
    }
    return with_changes(sc, policy=policy, nemesis=nemesis, checkers=checkers)


async def test_killing_the_scheduler_loses_nothing(tmp_path: Path) -> None:
    sc = owned(
        chaos_variant("burst", duration=120.0),
        nemesis=[{"action": "scheduler-kill", "at": 15.0, "for": 20.0}],
        checkers=[{"check": "fallback", "fault": "scheduler-kill", "max_decision": 0.5}],
    )
    result = await run_variant(sc, tmp_path)
    verdicts = {c.name: (c.verdict, c.detail) for c in result.checks}
    assert verdicts["fallback_scheduler-kill"][0] == "ok", verdicts
    assert verdicts["nothing_lost"][0] == "ok", verdicts
    req, dec = result.summary["requests"], result.summary["decisions"]
    assert req["failed"] == 0
    assert dec["by"]["policy"] > 0 and dec["by"]["fallback"] > 0, dec
    assert set(dec["fallback_reasons"]) <= {"unreachable", "late", "queued"}, dec
    # the service was started again at the end of the window (a Python start-up takes ~1.5 s
    # wall, 30 s real-world at time_scale 20) and decided again after it
    end = next(e for e in result.history if e.kind == "fault" and e.data["phase"] == "end")
    back = end.t + float(end.data["took_s"])
    after = [r for r in result.records if r.arrival > back and r.decided_by == "policy"]
    assert after, "the restarted scheduler never decided again"
    assert (tmp_path / "scheduler.stderr").exists() and (tmp_path / "scheduler.2.stderr").exists()


async def test_a_slow_then_paused_scheduler_falls_back_in_time(tmp_path: Path) -> None:
    sc = owned(
        chaos_variant("burst", duration=60.0),
        nemesis=[
            {"action": "scheduler-slow", "at": 10.0, "for": 15.0, "delay": 0.3},
            {"action": "scheduler-pause", "at": 35.0, "for": 10.0},
        ],
        checkers=[
            {"check": "fallback", "fault": "scheduler-slow", "max_decision": 0.5},
            {"check": "fallback", "fault": "scheduler-pause", "max_decision": 0.5},
        ],
    )
    result = await run_variant(sc, tmp_path)
    verdicts = {c.name: (c.verdict, c.detail) for c in result.checks}
    for name in ("fallback_scheduler-slow", "fallback_scheduler-pause", "nothing_lost"):
        assert verdicts[name][0] == "ok", verdicts
    dec = result.summary["decisions"]
    assert "late" in dec["fallback_reasons"], dec
    report = (tmp_path / "report.md").read_text()
    assert "## Decisions" in report and "| late |" in report


UNKNOWN = json.dumps(
    {
        "route": {
            "prefill_cluster": "prfaas",
            "prefill_instance": "prfaas-prefill-9",
            "decode_instance": "local-decode-0",
            "uncached_tokens": 1,
        }
    }
)


@pytest.mark.parametrize(
    ("answer", "delay_s", "reason"),
    [("{}", 0.05, "late"), ("<html>", 0.0, "garbage"), (UNKNOWN, 0.0, "unknown-instance")],
    ids=["50ms-late", "garbage", "unknown-instance"],
)
async def test_a_bad_service_never_decides_and_loses_nothing(
    answer: str, delay_s: float, reason: str, tmp_path: Path
) -> None:
    """Acceptance: a service 50 ms late against the default 20 ms timeout, or one answering
    garbage or an instance that does not exist: every decision falls back, with that reason,
    nothing is lost, and the report says so."""
    # the late service against the default 20 ms (lanes enough for every request of the run, so
    # each is sent and answered late, none queued); the others with room for a loaded machine
    frag = "#lanes=64" if reason == "late" else "#timeout=1s"
    with serve(Replay(200, answer, delay_s=delay_s).app()) as base:
        result = await run_variant(chaos_variant("burst", duration=30.0), tmp_path,
                                   policy=f"{base}/route{frag}")  # fmt: skip
    req, dec = result.summary["requests"], result.summary["decisions"]
    assert req["submitted"] == req["completed"] > 0
    assert dec["by"] == {"policy": 0, "fallback": req["submitted"]}
    assert dec["fallback_reasons"] == {reason: req["submitted"]}
    report = (tmp_path / "report.md").read_text()
    assert f"0 routed by the policy, {req['submitted']} by the fallback" in report
    assert all(r.fallback_reason and r.fallback_reason.startswith(reason) for r in result.records)
