"""#30: what a run says about its decisions. summary.json's `decisions` (the fallback's name,
reasons by the new kinds, ask-to-route and send-to-answer, the router's loop lag; no
`latency_real_ms` on the sim), the console's `decisions:` line (always for an outside policy,
never for a built-in one), report.md's Decisions section, the router's /stats and its loop-lag
sampler, and a sim run against the example service end to end."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from testbed.clock import Scale
from testbed.metrics.records import HistoryEvent, RequestRecord
from testbed.metrics.report import _decisions_section
from testbed.metrics.summary import _decisions_text, decisions
from testbed.policy import POLICIES
from testbed.policy.decider import FALLBACK_KINDS, fallback_kind
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.sim_run import run_sim
from testbed.services.router.api import create_app
from testbed.services.router.lag import LoopLag
from testbed.services.spec import ServiceSpec
from tests.chaos.harness import chaos_variant
from tests.policy.servers import PROMPT, example_app, serve


@pytest.fixture(autouse=True)
def _forget_policy_urls() -> Iterator[None]:
    yield
    POLICIES.forget_plugins()


def rec(i: int, by: str | None, why: str | None = None, wall: float | None = 0.004,
        answer: float | None = 0.003) -> RequestRecord:  # fmt: skip
    return RequestRecord(id=f"q{i}", input_tokens=10, output_tokens=10, arrival=float(i),
                         decided_by=by, fallback_reason=why, decision_wall_s=wall,
                         decision_answer_s=answer)  # fmt: skip


LIVE = {"substrate": "local"}
LAG = {"n": 100, "p50": 0.2, "p90": 0.5, "p99": 3.5, "max": 9.0}


def live_run(records: list[RequestRecord], fallback: str | None, lag: Any = LAG) -> dict[str, Any]:
    history = [HistoryEvent(9.0, "decisions", {"fallback": fallback, "loop_lag_ms": lag})]
    return {**LIVE, "decisions": decisions(records, history, Scale(10.0, 1.0))}


# ------------------------------------------------------------------ kinds


def test_timeout_splits_into_queued_and_late_and_old_records_still_count() -> None:
    assert "timeout" not in FALLBACK_KINDS and {"queued", "late"} <= set(FALLBACK_KINDS)
    assert fallback_kind("queued: no free lane within 50ms (8 lanes busy)") == "queued"
    assert fallback_kind("late: no answer within 50ms") == "late"
    old = "timeout: no answer within 50ms (queued behind other decisions)"
    assert fallback_kind(old) == "queued"
    assert fallback_kind("timeout: no answer within 50ms") == "late"
    assert fallback_kind("error: TimeoutError: the plugin's own") == "error"


# ------------------------------------------------------------------ summary, console, report


def test_a_clean_outside_run_still_prints_its_decisions_line() -> None:
    summary = live_run([rec(i, "policy") for i in range(5)], "prfaas-static")
    d = summary["decisions"]
    assert d["fallback"] == "prfaas-static" and d["fallback_reasons"] == {}
    assert d["answer_wall_ms"]["n"] == 5 and d["answer_wall_ms"]["p50"] == pytest.approx(3.0)
    assert d["latency_real_ms"]["p50"] == pytest.approx(40.0)  # wall x time_scale 10
    (line,) = _decisions_text(summary)
    assert line.startswith("decisions: 5 by the policy, 0 by the fallback (prfaas-static); ")
    assert "ask-to-route p50 4 p99 4 ms" in line and "send-to-answer p50 3 p99 3 ms" in line
    assert "loop lag p99 3.5 ms" in line


def test_fallbacks_are_counted_by_kind_and_named() -> None:
    recs = [rec(0, "policy"), rec(1, "fallback", "queued: no free lane", answer=None),
            rec(2, "fallback", "late: no answer within 50ms", answer=None),
            rec(3, "fallback", "status: HTTP 500")]  # fmt: skip
    summary = live_run(recs, "prfaas-nolongterm")
    d = summary["decisions"]
    assert d["by"] == {"policy": 1, "fallback": 3}
    assert d["fallback_reasons"] == {"late": 1, "queued": 1, "status": 1}
    assert d["answer_wall_ms"]["n"] == 2  # the route, and the 500 read in time
    (line,) = _decisions_text(summary)
    assert "3 by the fallback (prfaas-nolongterm: late 1, queued 1, status 1)" in line
    report = "\n".join(_decisions_section(summary))
    assert "1 routed by the policy, 3 by the fallback (prfaas-nolongterm)" in report
    for row in ("| queued | 1 |", "| late | 1 |", "| ask-to-route, wall |",
                "| ask-to-route, real-world |", "| send-to-answer, wall | 2 |",
                "event-loop lag: p99 3.5 ms"):  # fmt: skip
        assert row in report, row


def test_a_builtin_policy_prints_no_decisions_line() -> None:
    summary = live_run([rec(i, "policy", answer=None) for i in range(3)], None)
    assert _decisions_text(summary) == []
    assert "## Decisions" in "\n".join(_decisions_section(summary))  # its latency, as before


def test_a_missing_loop_lag_is_null_not_an_error() -> None:
    summary = {**LIVE, "decisions": decisions([rec(0, "policy")], [], Scale())}
    d = summary["decisions"]
    assert d["loop_lag_ms"] is None and d["fallback"] is None
    (line,) = _decisions_text(summary)  # an answer was timed: an outside policy
    assert "loop lag" not in line
    assert "event-loop lag" not in "\n".join(_decisions_section(summary))


def test_the_sim_reports_wall_latency_only() -> None:
    walls = {"n": 2, "p50": 1.0, "p90": 1.0, "p99": 1.0, "max": 1.0}
    event = {"wall_ms": walls, "answer_wall_ms": walls, "fallback": "naive"}
    recs = [rec(i, "policy", wall=None, answer=None) for i in range(2)]
    history = [HistoryEvent(1.0, "decisions", event)]
    summary = {"substrate": "sim", "decisions": decisions(recs, history, Scale())}
    d = summary["decisions"]
    assert "latency_real_ms" not in d and d["loop_lag_ms"] is None
    assert (d["latency_wall_ms"], d["answer_wall_ms"], d["fallback"]) == (walls, walls, "naive")
    report = "\n".join(_decisions_section(summary))
    assert "real-world" not in report and "| send-to-answer, wall | 2 |" in report


def test_a_record_writes_send_to_answer_only_when_it_has_one() -> None:
    assert "decision_answer_s" not in rec(0, "policy", answer=None).to_json()
    doc = rec(0, "policy", answer=0.002).to_json()
    assert doc["decision_answer_s"] == 0.002
    assert RequestRecord.from_json(doc).decision_answer_s == 0.002


# ------------------------------------------------------------------ the router's side


async def test_the_loop_lag_sampler_sees_a_blocked_loop() -> None:
    lag = LoopLag(interval_s=0.01)
    task = asyncio.create_task(lag.run())
    await asyncio.sleep(0.03)
    time.sleep(0.1)  # the loop is blocked: the sampler's timer cannot fire
    await asyncio.sleep(0.03)
    task.cancel()
    out = lag.to_json()
    assert out is not None and out["n"] >= 2 and out["max"] >= 50.0


def test_the_loop_lag_keeps_a_bounded_sample() -> None:
    lag = LoopLag(keep=100)
    assert lag.to_json() is None
    for i in range(10_000):
        lag.add(i / 1e6)
    out = lag.to_json()
    assert len(lag.samples) == 100 and out is not None
    assert out["n"] == 10_000 and out["max"] == pytest.approx(9.999)


@pytest.mark.parametrize(("policy", "fallback"),
                         [("prfaas-static", None),
                          ("http://127.0.0.1:9/route#fallback=naive", "naive")])  # fmt: skip
async def test_the_router_says_its_fallback_and_loop_lag_in_stats(
    policy: str, fallback: str | None
) -> None:
    app, _ = await create_app(
        ServiceSpec(role="router", id="r", policy=policy, threshold_tokens=8000)
    )
    async with TestClient(TestServer(app)) as client:
        await asyncio.sleep(0.12)  # two samples
        stats = await (await client.get("/stats")).json()
    assert stats["decisions"]["fallback"] == fallback
    assert stats["decisions"]["loop_lag_ms"]["n"] >= 1


# ------------------------------------------------------------------ a whole run (sim)


def test_a_sim_run_of_a_good_service_accounts_for_every_decision(tmp_path: Path) -> None:
    with serve(example_app()) as base:
        sc = chaos_variant("burst", duration=10.0)
        policy = f"{base}/route#{PROMPT}&fallback=prfaas-nolongterm"
        opts = RunOptions(substrate="sim", out_dir=tmp_path, drain_timeout_s=30, policy=policy)
        result = run_sim(prepare_run(sc, opts), opts)
    d = result.summary["decisions"]
    n = result.summary["requests"]["submitted"]
    assert d["by"] == {"policy": n, "fallback": 0} and d["fallback"] == "prfaas-nolongterm"
    assert d["answer_wall_ms"]["n"] == n and "latency_real_ms" not in d
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["decisions"]["answer_wall_ms"]["n"] == n
    recs = (tmp_path / "requests.jsonl").read_text()
    assert "decision_answer_s" not in recs  # the sim's records: the same for the same seed
    (line,) = _decisions_text(result.summary)
    assert line.startswith(f"decisions: {n} by the policy, 0 by the fallback (prfaas-nolongterm)")
    assert "prfaas-nolongterm" in (tmp_path / "report.md").read_text()
