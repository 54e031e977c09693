"""#16 item 6 without a live run: the scheduler faults do what their fields say to the scheduler
the run owns, the `fallback` checker judges hand-made records, a scenario owns its scheduler's
process on the sim too, and `debug_validate` checks answers against the schemas."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from testbed.checkers import run_checkers
from testbed.checkers.fallback import FallbackCheck
from testbed.config import PolicyConfig
from testbed.metrics.records import HistoryEvent, RequestRecord
from testbed.nemesis import ACTIONS, PlannedFault
from testbed.policy import POLICIES
from testbed.policy.base import InstanceLoad, RequestView, Snapshot
from testbed.policy.decider import Decider
from testbed.scenario.outside import needs_owned_scheduler
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.schema import Scenario
from testbed.scenario.sim_run import run_sim
from tests.chaos.harness import chaos_variant
from tests.policy.servers import EXAMPLE, PROMPT, Replay, serve


@pytest.fixture(autouse=True)
def _forget_policy_urls() -> Iterator[None]:
    """A policy URL registers as a plugin when first named: drop them after each test, so the
    registry's list of known names stays what other tests expect."""
    yield
    POLICIES.forget_plugins()


# ------------------------------------------------------------------ the actions


class Scheduler:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    async def kill(self) -> dict[str, Any]:
        self.calls.append(("kill",))
        return {}

    async def restart(self) -> dict[str, Any]:
        self.calls.append(("restart",))
        return {}

    async def pause(self) -> dict[str, Any]:
        self.calls.append(("pause",))
        return {}

    async def resume(self) -> dict[str, Any]:
        self.calls.append(("resume",))
        return {}

    async def slow(self, delay: float, /) -> dict[str, Any]:
        self.calls.append(("slow", delay))
        return {}

    async def unslow(self) -> dict[str, Any]:
        self.calls.append(("unslow",))
        return {}


class Ctx:
    def __init__(self) -> None:
        self.scheduler = Scheduler()


async def play(entry: dict[str, Any], ctx: Any) -> None:
    config = ACTIONS[entry["action"]].config
    fault = ACTIONS[entry["action"]](PlannedFault(0, config.model_validate(entry), ()))
    await fault.start(ctx)
    if fault.event.end is not None:
        await fault.end(ctx)


@pytest.mark.parametrize(
    ("entry", "calls"),
    [
        ({"action": "scheduler-kill", "at": "10s"}, [("kill",)]),
        ({"action": "scheduler-kill", "at": "10s", "for": "5s"}, [("kill",), ("restart",)]),
        ({"action": "scheduler-pause", "at": "10s", "for": "5s"}, [("pause",), ("resume",)]),
        ({"action": "scheduler-slow", "at": "1s", "for": "5s", "delay": "50ms"},
         [("slow", 0.05), ("unslow",)]),
    ],
)  # fmt: skip
async def test_scheduler_faults_act_on_the_owned_scheduler(
    entry: dict[str, Any], calls: list[tuple[Any, ...]]
) -> None:
    ctx = Ctx()
    await play(entry, ctx)
    assert ctx.scheduler.calls == calls


def test_scheduler_faults_need_their_window_and_an_owned_scheduler() -> None:
    for action in ("scheduler-pause", "scheduler-slow"):
        with pytest.raises(ValidationError):
            ACTIONS[action].config.model_validate({"action": action, "at": 1, "delay": 0.1})
    with pytest.raises(ValidationError):
        ACTIONS["scheduler-slow"].config.model_validate(
            {"action": "scheduler-slow", "at": 1, "for": 1}
        )
    with pytest.raises(Exception, match="needs a scheduler the scenario owns"):
        needs_owned_scheduler("http://h:1/r", None, ["scheduler-kill"])
    assert not needs_owned_scheduler("prfaas", None, ["bandwidth"])
    assert needs_owned_scheduler("http://h:1/r", ["x"], [])


async def test_a_run_without_a_scheduler_records_the_fault_as_an_error() -> None:
    class Bare:
        pass

    with pytest.raises(RuntimeError, match="owns no outside scheduler"):
        await play({"action": "scheduler-kill", "at": "10s"}, Bare())


# ------------------------------------------------------------------ the checker


def rec(
    rid: str, arrival: float, by: str | None, wall: float | None, status: str = "completed"
) -> RequestRecord:
    return RequestRecord(id=rid, input_tokens=100, output_tokens=4, arrival=arrival,
                         status=status, decided_by=by, decision_wall_s=wall,
                         failure_reason=None if status == "completed" else "boom")  # type: ignore[arg-type]  # fmt: skip


def window(action: str = "scheduler-kill") -> list[HistoryEvent]:
    return [
        HistoryEvent(10.0, "fault", {"action": action, "phase": "start", "index": 0}),
        HistoryEvent(20.0, "fault", {"action": action, "phase": "end", "index": 0}),
    ]


def verdict(
    records: list[RequestRecord], cfg: dict[str, Any], history: list[HistoryEvent]
) -> tuple[str, str]:
    check = FallbackCheck.model_validate(cfg)
    results = run_checkers(records, [r.id for r in records], history=history, configs=[check])
    res = next(r for r in results if r.name.startswith("fallback_"))
    return res.verdict, res.detail


CFG = {"check": "fallback", "fault": "scheduler-kill", "max_decision": "100ms"}


def test_fallback_check_passes_lost_slow_and_vacuous() -> None:
    ok = [
        rec("a", 5, "policy", 0.001),
        rec("b", 12, "fallback", 0.03),
        rec("c", 15, "fallback", 0.02),
    ]
    v, detail = verdict(ok, CFG, window())
    assert v == "ok" and "2 routed by the fallback" in detail
    lost = [*ok, rec("d", 16, "fallback", 0.02, status="failed")]
    v, detail = verdict(lost, CFG, window())
    assert v == "failed" and "not completed" in detail and "d" in detail
    slow = [*ok, rec("e", 17, "fallback", 0.25)]
    assert verdict(slow, CFG, window())[0] == "failed"
    assert verdict(slow, {**CFG, "max_decision": "300ms"}, window())[0] == "ok"
    kept = [rec("a", 12, "policy", 0.001)]
    assert verdict(kept, CFG, window())[0] == "vacuous"
    assert verdict(ok, {**CFG, "fault": "scheduler-pause"}, window())[0] == "vacuous"
    assert verdict(ok, {**CFG, "fault": "scheduler-pause"}, window("scheduler-pause"))[0] == "ok"


def test_fallback_check_needs_its_fault_in_the_timeline() -> None:
    check = FallbackCheck.model_validate(CFG)
    assert check.problems([], 100.0)
    with pytest.raises(ValidationError, match="unknown nemesis action"):
        FallbackCheck.model_validate({**CFG, "fault": "scheduler-nap"})


# ------------------------------------------------------------------ owning it, validating


def owned_scenario(port: int, **policy: Any) -> Scenario:
    sc = chaos_variant("burst", duration=30.0)
    doc = sc.model_dump(by_alias=True, exclude_none=True)
    doc["policy"] = {
        "kind": "http",
        "url": f"http://127.0.0.1:{port}/route",
        "timeout": 1.0,
        "command": [sys.executable, "-m", "least_ttft.server", "--port", str(port)],
        **policy,
    }
    return Scenario.model_validate(doc)


def test_a_scenario_owns_its_scheduler_on_the_sim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(EXAMPLE))
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sc = owned_scenario(port)
    opts = RunOptions(substrate="sim", out_dir=tmp_path, drain_timeout_s=30)
    result = run_sim(prepare_run(sc, opts), opts)
    dec = result.summary["decisions"]
    assert dec["by"] == {"policy": result.summary["requests"]["submitted"], "fallback": 0}
    assert "serving prfaas-policy/1" in (tmp_path / "scheduler.stdout").read_text()
    with pytest.raises(OSError):  # stopped after the run
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()


def test_debug_validate_checks_answers_against_the_schemas() -> None:
    name = PolicyConfig.model_validate(
        {"kind": "http", "url": "http://h:1/r", "debug_validate": True}
    ).name
    assert name.endswith("#validate=1")
    snap = Snapshot(1.0, (InstanceLoad("p0", "prfaas", "prefill", 0, 0.0),
                          InstanceLoad("d0", "local", "decode", 0, 0.0)), 8000.0)  # fmt: skip
    route = {"prefill_cluster": "prfaas", "prefill_instance": "p0", "decode_instance": "d0",
             "uncached_tokens": 5, "pull_prefix_tokens": 0}  # fmt: skip
    body = json.dumps({"route": route, "protocol": "prfaas-policy/1"})
    answer = body.replace(
        '"protocol": "prfaas-policy/1"', '"protocol": "prfaas-policy/1", "route_extra": 1'
    )
    bad = answer.replace(
        '"uncached_tokens": 5', '"uncached_tokens": 5, "prefill_cluster_2": 1'
    ).replace('"prefill_instance": "p0"', '"prefill_instance": 7')
    with serve(Replay(200, bad).app()) as base:
        for frag, needle in (("", "must be strings"), ("&validate=1", "schema")):
            dec = Decider.for_spec(f"{base}/route#{PROMPT}{frag}")
            d = dec.decide(RequestView("q", 9000, 10), snap)
            dec.close()
            assert d.decided_by == "fallback" and needle in (d.fallback_reason or ""), d
