"""#30: the `policy_share` checker (testbed/checkers/policy_share.py): a run of an outside
policy fails when the policy decided less than `min` of the routes itself, decisions asked
during scheduler faults left out; on by default for outside policies only."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from testbed.checkers import CHECKERS, CheckResult, run_checker
from testbed.checkers.policy_share import PolicyShareCheck, policy_share
from testbed.metrics.records import HistoryEvent, RequestRecord
from testbed.policy import POLICIES
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.schema import Scenario, load_scenario
from testbed.scenario.sim_run import run_sim
from tests.chaos.harness import chaos_variant
from tests.policy.servers import PROMPT, Replay, serve

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "tiny.yaml"
RR = "tests.scenario.round_robin:RoundRobin"


@pytest.fixture(autouse=True)
def _forget_plugins() -> Iterator[None]:
    yield
    POLICIES.forget_plugins()  # the registry is global: no plugin outlives its test


def rec(i: int, arrival: float, by: str | None = "policy", why: str | None = None) -> RequestRecord:
    r = RequestRecord(id=f"r{i:04d}", input_tokens=100, output_tokens=2, arrival=arrival)
    return replace(r, decided_by=by, fallback_reason=why)


def fault(t: float, action: str, phase: str, took_s: float = 0.0) -> HistoryEvent:
    return HistoryEvent(t, "fault", {"action": action, "phase": phase, "index": 0,
                                     "target": "scheduler", "took_s": took_s})  # fmt: skip


def judge(
    records: list[RequestRecord], history: Sequence[HistoryEvent] = (), **cfg: Any
) -> CheckResult:
    entry = PolicyShareCheck.model_validate({"check": "policy_share", **cfg})
    return run_checker(entry, records, list(history), len(records))


def test_the_share_fails_under_min_and_names_the_fallbacks_by_kind() -> None:
    records = [rec(i, float(i)) for i in range(97)]
    records += [
        rec(97, 97.0, "fallback", "status: HTTP 500"),
        rec(98, 98.0, "fallback", "status: HTTP 503"),
        rec(99, 99.0, "fallback", "late: no answer in 20 ms"),
        rec(100, 100.0, None),  # never routed: not a decision
    ]
    res = judge(records)
    assert res.verdict == "failed" and res.failed and not res.ok
    assert res.detail == (
        "the policy decided 97 of 100 (97.0%, at least 99.0%); by the fallback 3 (status 2, late 1)"
    )
    assert judge(records, min=0.9).verdict == "ok"  # `min` is the scenario's to set
    assert judge(records[:97]).verdict == "ok"
    assert "100.0%" in judge(records[:97]).detail


def test_no_decision_is_vacuous_which_is_not_ok_and_not_failed() -> None:
    res = judge([rec(1, 1.0, None)])
    assert res.verdict == "vacuous" and not res.ok and not res.failed
    assert res.to_json()["ok"] is False and res.to_json()["verdict"] == "vacuous"
    assert "no routing decision to judge" in res.detail


def test_decisions_during_scheduler_faults_are_left_out() -> None:
    # a kill from 10 s to 20 s whose restart took 5 s: the fallback decides 10-25 s, by design
    history = [fault(10.0, "scheduler-kill", "start"), fault(20.0, "scheduler-kill", "end", 5.0),
               fault(30.0, "bandwidth", "start"), fault(40.0, "bandwidth", "end")]  # fmt: skip
    records = [rec(i, float(i), "fallback" if 10 <= i < 25 else "policy", "unreachable: x")
               for i in range(50)]  # fmt: skip
    share = policy_share(records, history, settle_s=0.0)
    assert (share.policy, share.fallback, share.left_out) == (35, 0, 15)
    res = judge(records, history, settle=0.0)
    assert res.verdict == "ok", res.detail
    assert "15 asked during scheduler faults left out" in res.detail
    # without the fault, the same records fail; a link fault is no excuse
    assert judge(records, history[2:]).verdict == "failed"
    # everything inside the window: nothing left to judge
    assert judge(records[10:25], history).verdict == "vacuous"


def test_the_check_is_on_by_default_for_outside_policies_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    sc = load_scenario(TINY)

    def checks(scenario: Scenario, policy: str | None) -> list[Any]:
        rp = prepare_run(scenario, RunOptions(policy=policy, out_dir=Path("unused")))
        return [c for c in rp.scenario.checkers if c.check == "policy_share"]

    assert checks(sc, None) == []  # the scenario's built-in policy: no fallback, no check
    assert checks(sc, "prfaas-static") == []
    assert checks(sc, RR) == [PolicyShareCheck()]  # a plugin: module:Class
    assert checks(sc, "http://127.0.0.1:9/route#timeout=1s") == [PolicyShareCheck()]
    assert PolicyShareCheck().min == 0.99
    # a scenario that lists its own keeps it, with its min, and gets no second one
    doc = sc.model_dump(by_alias=True, exclude_none=True)
    doc["checkers"] = [*doc.get("checkers", []), {"check": "policy_share", "min": 0.9}]
    own = Scenario.model_validate(doc)
    assert [c.min for c in checks(own, RR)] == [0.9]
    assert [c.min for c in checks(own, None)] == [0.9]  # listed: it runs for any policy


def test_a_service_answering_500_fails_the_run_on_the_sim(tmp_path: Path) -> None:
    """Acceptance (#30): every decision falls back; the run says so and exits 1."""
    sc = chaos_variant("burst", duration=20.0)
    with serve(Replay(500, '{"error": "down"}').app()) as base:
        opts = RunOptions(substrate="sim", policy=f"{base}/route#{PROMPT}",
                          out_dir=tmp_path, progress=False)  # fmt: skip
        result = run_sim(prepare_run(sc, opts), opts)
    checks = {c.name: c for c in result.checks}
    share = checks["policy_share"]
    n = result.summary["requests"]["submitted"]
    assert share.verdict == "failed", share.detail
    assert share.detail.startswith(f"the policy decided 0 of {n} (0.0%, at least 99.0%)")
    assert f"by the fallback {n} (status {n})" in share.detail
    assert checks["nothing_lost"].verdict == "ok"  # the fallback lost nothing
    assert not result.ok and result.exit_code == 1
    assert CHECKERS["policy_share"].config is PolicyShareCheck


def test_a_faults_aftermath_is_left_out_for_settle_after_its_end() -> None:
    """A slowed proxy still holds answers after `scheduler-slow` ends, and a resumed service
    first works off what queued while it was stopped: `settle` (default 10 s) after the end is
    still the fault's; a fallback later than that counts against the policy."""
    history = [fault(10.0, "scheduler-slow", "start"), fault(20.0, "scheduler-slow", "end")]
    records = [rec(i, float(i), "fallback" if 10 <= i < 27 else "policy", "late: x")
               for i in range(100)]  # fmt: skip
    assert judge(records, history).verdict == "ok"  # 20-27 s: the aftermath, within 10 s
    assert policy_share(records, history).left_out == 20  # 10-30 s
    strict = judge(records, history, settle=0.0)
    assert strict.verdict == "failed" and "late 7" in strict.detail
    assert judge(records, history, settle="5s").verdict == "failed"  # 25-27 s are past it
