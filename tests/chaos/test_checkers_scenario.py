"""The scenario checkers and the nemesis planner/player, on hand-made records and a fake
substrate (fast: no processes). Each checker passes on a healthy history and fails on the
history a broken variant leaves behind."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import pytest

from testbed.checkers import (
    check_failures,
    check_generator_count,
    check_latency,
    check_recover,
    check_reroute,
    run_checkers,
)
from testbed.checkers.failures import FailuresCheck
from testbed.checkers.latency import LatencyCheck
from testbed.clock import LiveClock
from testbed.metrics.records import HistoryEvent, RequestRecord
from testbed.nemesis import (
    NemesisPlayer,
    burst_requests,
    instance_ids,
    plan_faults,
)
from testbed.nemesis.actions.kill import KillAction
from testbed.nemesis.actions.partition import PartitionAction
from testbed.scenario.schema import Scenario
from testbed.workload.generate import RequestSpec
from tests.chaos.harness import chaos_variant


def rec(i: int, arrival: float, ttft: float = 1.0, **kw: Any) -> RequestRecord:
    base = RequestRecord(
        id=f"r{i:06d}",
        input_tokens=kw.pop("input_tokens", 30_000),
        output_tokens=4,
        arrival=arrival,
        status="completed",
        tokens_out=4,
        route="prfaas",
        prefill_instance="prfaas-prefill-0",
        decode_instance="local-decode-0",
        cross_dc=True,
        prefill_start=arrival + 0.1,
        first_token=arrival + ttft,
        last_token=arrival + ttft + 0.075,
        kv_wire_bytes_expected=10,
        kv_wire_bytes_sent=10,
        kv_wire_bytes_received=10,
        kv_verified=True,
        threshold_tokens=19_500,
    )
    return replace(base, **kw)


def fault(t: float, action: str, phase: str, target: str = "link", index: int = 0) -> HistoryEvent:
    return HistoryEvent(
        t, "fault", {"action": action, "phase": phase, "target": target, "index": index}
    )


PARTITION = [fault(60, "partition", "start"), fault(100, "partition", "end")]


def local(i: int, arrival: float, **kw: Any) -> RequestRecord:
    return rec(i, arrival, route="local", prefill_instance="local-prefill-0", cross_dc=False, **kw)


def test_reroute_passes_when_offloadable_requests_go_local_during_a_partition() -> None:
    records = [rec(1, 50), local(2, 62), local(3, 70), rec(4, 110)]
    c = check_reroute(records, PARTITION, "partition", within_s=10)
    assert c.ok, c.detail
    assert "re-routed after 2.1s" in c.detail


def test_reroute_fails_when_requests_keep_crossing_the_cut_link() -> None:
    # broken variant: the router never re-routes, so long requests fail or wait for the link
    records = [
        rec(1, 50),
        rec(2, 62, status="failed", failure_reason="kv transfer: unreachable", tokens_out=0),
        rec(3, 70, prefill_start=101.0),
        local(4, 95),
    ]
    c = check_reroute(records, PARTITION, "partition", within_s=10)
    assert not c.ok, c.detail


def test_reroute_for_a_killed_instance_and_missing_fault() -> None:
    kill = [
        fault(40, "kill", "start", "prfaas-prefill-0"),
        fault(80, "kill", "end", "prfaas-prefill-0"),
    ]
    healthy = [rec(1, 41, prefill_instance="prfaas-prefill-1")]
    assert check_reroute(healthy, kill, "kill", 10).ok
    stuck = [rec(1, 41), rec(2, 60, prefill_instance="prfaas-prefill-1")]  # only 20 s later
    assert not check_reroute(stuck, kill, "kill", 10).ok
    never = check_reroute(healthy, [], "kill", 10)  # the fault never happened: nothing tested
    assert never.verdict == "vacuous" and "exercised nothing" in never.detail, never


def test_recover_passes_and_fails() -> None:
    after = [rec(10 + i, 100 + 2 * i, ttft=30.0 if i < 3 else 2.0) for i in range(8)]
    ok = check_recover(after, PARTITION, "partition", within_s=10, ttft_s=10, streak=3)
    assert ok.ok, ok.detail
    slow = [rec(10 + i, 100 + 2 * i, ttft=30.0 if i < 6 else 2.0) for i in range(10)]
    bad = check_recover(slow, PARTITION, "partition", within_s=10, ttft_s=10, streak=3)
    assert not bad.ok, bad.detail
    never = check_recover(slow[:6], PARTITION, "partition", within_s=10, ttft_s=10)
    assert not never.ok and "never back" in never.detail
    unended = check_recover(after, PARTITION[:1], "partition", within_s=10, ttft_s=10)
    assert unended.verdict == "vacuous" and "never ended" in unended.detail


def test_latency_failures_and_generator_count() -> None:
    records = [rec(i, float(i), ttft=1.0 + i / 10) for i in range(100)]
    assert check_latency(records, "ttft", 90, 11.0).ok
    assert not check_latency(records, "ttft", 90, 5.0).ok
    assert check_latency(records, "tpot", 99, 0.03).ok
    assert check_latency([], "ttft", 50, 1.0).verdict == "vacuous"
    failed = [replace(r, status="failed", failure_reason="x") for r in records[:3]]
    assert check_failures(failed + records[3:], 100, 0.05).ok
    assert not check_failures(failed + records[3:], 100, 0.02).ok
    ids = [r.id for r in records]
    assert check_generator_count(100, ids).ok
    assert not check_generator_count(101, ids).ok  # a request the generator planned vanished
    cfgs = [
        LatencyCheck(check="ttft", p=90, max=11.0),
        FailuresCheck(max_fraction=0),
    ]
    results = run_checkers(records, ids, history=[], configs=cfgs, planned=100)
    assert [c.name for c in results][-2:] == ["ttft_p90", "failures"]
    assert all(c.ok for c in results)


# ---------------------------------------------------------------------------------- nemesis


def test_plan_is_a_function_of_the_seed() -> None:
    sc = chaos_variant("decode-crash")
    ids = instance_ids(2, 1, 2)
    a = plan_faults(sc, ids, link_enabled=True)
    b = plan_faults(sc, ids, link_enabled=True)
    assert [f.targets for f in a] == [f.targets for f in b]
    targets = {
        plan_faults(sc.model_copy(update={"seed": s}), ids, link_enabled=True)[0].targets
        for s in range(20)
    }
    assert len(targets) == 2  # the group pick varies with the seed


def test_plan_rejects_unknown_instances_and_link_faults_without_a_link() -> None:
    from testbed.errors import ConfigError

    sc = chaos_variant("decode-crash")
    bad = sc.model_copy(update={"nemesis": [KillAction(at=1, target="local-decode-7")]})
    with pytest.raises(ConfigError, match=r"nemesis\.0\.target: no instance 'local-decode-7'"):
        plan_faults(bad, instance_ids(1, 1, 2), link_enabled=True)
    with pytest.raises(ConfigError, match="needs a cross-datacenter link"):
        plan_faults(chaos_variant("partition"), instance_ids(0, 2, 2), link_enabled=False)


def test_bursts_are_deterministic_sorted_and_inside_the_window() -> None:
    sc = chaos_variant("diurnal")
    base = [RequestSpec(f"r{i:06d}", float(i), 100, 10) for i in range(180)]
    a = burst_requests(sc, base, 1.0, 180.0)
    assert a == burst_requests(sc, base, 1.0, 180.0)
    extra = [r for r in a if r.id.startswith("b")]
    assert 80 < len(extra) < 160  # about (2-1) x 100 s + (2-1) x 40 s at 1 req/s
    assert all(30 <= r.arrival < 130 for r in extra)
    assert [r.arrival for r in a] == sorted(r.arrival for r in a)
    assert len({r.id for r in a}) == len(a)


class FakeSubstrate:
    def __init__(self) -> None:
        self.calls: list[tuple[float, str, str]] = []

    async def kill(self, h: Any) -> None:
        self.calls.append((time.monotonic(), "kill", h.spec.id))

    async def pause(self, h: Any) -> None:
        self.calls.append((time.monotonic(), "pause", h.spec.id))

    async def resume(self, h: Any) -> None:
        self.calls.append((time.monotonic(), "resume", h.spec.id))

    async def restart(self, h: Any) -> Any:
        await asyncio.sleep(0.3)  # slow: must not delay the other faults
        self.calls.append((time.monotonic(), "restart", h.spec.id))
        return h


class FakeHandle:
    def __init__(self, sid: str) -> None:
        self.spec = type("Spec", (), {"id": sid})()


class FakeCtx:
    def __init__(self) -> None:
        self.substrate: Any = FakeSubstrate()
        self.services: Any = {i: FakeHandle(i) for i in instance_ids(1, 1, 2)}
        self.link = None
        self.clock = LiveClock(time_scale=100.0)


async def test_player_records_every_phase_and_survives_a_failing_fault() -> None:
    sc = Scenario.model_validate(
        {
            "deployments": {
                "d": {"kind": "homogeneous", "local": {"hardware": "h20x8", "instances": 3}}
            },
            "nemesis": [
                {"action": "kill", "at": "10s", "for": "10s", "target": "local-decode-0"},
                {"action": "pause", "at": "15s", "for": "5s", "target": "local-prefill-0"},
                {"action": "restart", "at": "12s", "target": "local-decode-1"},
            ],
        }
    )
    faults = plan_faults(sc, instance_ids(1, 1, 2), link_enabled=True)
    ctx = FakeCtx()
    history: list[HistoryEvent] = []
    ctx.clock = LiveClock(time_scale=100.0)
    t0 = ctx.clock.epoch
    await asyncio.wait_for(NemesisPlayer(ctx, faults, history, ctx.clock).run(), 5)
    got = [(e.data["action"], e.data["phase"], e.data["target"]) for e in history]
    assert sorted(got) == sorted(
        [
            ("kill", "start", "local-decode-0"),
            ("kill", "end", "local-decode-0"),
            ("pause", "start", "local-prefill-0"),
            ("pause", "end", "local-prefill-0"),
            ("restart", "start", "local-decode-1"),
        ]
    )
    assert all("error" not in e.data for e in history)
    calls = {(what, sid): t - t0 for t, what, sid in ctx.substrate.calls}
    # the pause at 15 s real (0.15 s wall) was not held up by the slow restart at 12 s
    assert calls[("pause", "local-prefill-0")] < 0.25
    # a link fault on a run without a link is recorded with its error, not raised
    link_sc = sc.model_copy(update={"nemesis": [PartitionAction(at=0, **{"for": 1})]})
    hist2: list[HistoryEvent] = []
    await NemesisPlayer(
        ctx, plan_faults(link_sc, [], link_enabled=True), hist2, ctx.clock.rebased()
    ).run()
    assert len(hist2) == 1 and "no link emulator" in hist2[0].data["error"]


# ---------------------------------------------------------------------------------- vacuous


def test_reroute_is_vacuous_when_no_request_arrives_during_the_fault() -> None:
    # issue #12 item 14: this passed as ok before, though the partition exercised nothing
    records = [rec(1, 50), rec(2, 105), local(3, 110)]
    c = check_reroute(records, PARTITION, "partition", within_s=10)
    assert not c.ok and not c.failed and c.verdict == "vacuous", c  # neither pass nor fail
    assert "no request needing re-routing arrived during it" in c.detail
    # short requests (below the threshold) during a link fault are not in scope either
    short = [rec(1, 50), local(2, 70, input_tokens=1_000)]
    assert check_reroute(short, PARTITION, "partition", within_s=10).verdict == "vacuous"


def test_reroute_over_several_faults_is_failed_or_vacuous_if_any_part_is() -> None:
    two = [*PARTITION, fault(130, "partition", "start", index=1)]
    two.append(fault(150, "partition", "end", index=1))
    served_first = [rec(1, 50), local(2, 62)]  # nothing arrives during the second
    c = check_reroute(served_first, two, "partition", within_s=10)
    assert c.verdict == "vacuous" and "re-routed after" in c.detail, c
    stuck_second = [*served_first, rec(3, 131, prefill_start=151.0)]
    assert check_reroute(stuck_second, two, "partition", within_s=10).verdict == "failed"
    both = [*served_first, local(3, 131)]
    assert check_reroute(both, two, "partition", within_s=10).verdict == "ok"


def test_recover_is_vacuous_without_enough_requests_after_the_end() -> None:
    before_only = [rec(1, 50), rec(2, 70)]
    c = check_recover(before_only, PARTITION, "partition", within_s=10, ttft_s=10)
    assert c.verdict == "vacuous" and "0 requests arrived after it" in c.detail, c
    two_after = [rec(1, 101), rec(2, 102)]  # streak 3 cannot be seen in two requests
    assert check_recover(two_after, PARTITION, "partition", 10, 10).verdict == "vacuous"
    # but requests enough that never recover are a failure, not vacuous
    slow = [rec(i, 100 + i, ttft=30.0) for i in range(5)]
    assert check_recover(slow, PARTITION, "partition", 10, 10).verdict == "failed"
    assert check_recover(slow, [], "partition", 10, 10).verdict == "vacuous"


def test_latency_is_vacuous_with_nothing_to_take_a_percentile_of() -> None:
    all_failed = [rec(i, float(i), status="failed", failure_reason="x") for i in range(10)]
    c = check_latency(all_failed, "ttft", 90, 5.0)
    assert c.verdict == "vacuous" and "10 requests, 10 failed" in c.detail, c
    ok = [rec(i, float(i)) for i in range(100)]
    never = check_latency(ok, "ttft", 90, 5.0, history=[], during="partition")
    assert never.verdict == "vacuous" and "no 'partition' fault was applied" in never.detail
    errored = [
        HistoryEvent(
            60, "fault", {"action": "partition", "phase": "start", "index": 0, "error": "boom"}
        )
    ]
    c = check_latency(ok, "ttft", 90, 5.0, history=errored, during="partition")
    assert c.verdict == "vacuous" and "failed to apply (boom)" in c.detail, c
    quiet_before = [r for r in ok if r.arrival >= 60]  # no pre-fault value for max_ratio
    c = check_latency(
        quiet_before, "ttft", 90, 0, history=PARTITION, during="partition", max_ratio=2
    )
    assert c.verdict == "vacuous" and "no pre-fault value" in c.detail, c
    assert check_latency(ok, "ttft", 90, 5.0, history=PARTITION, during="partition").ok
    assert check_failures([], 0, 0.0).verdict == "vacuous"


def test_every_library_scenario_fails_its_checkers_when_every_request_fails() -> None:
    # issue #12 item 13: burst and paper had no checker, so a run in which every request
    # failed passed them. Each scenario's own checkers (not the built-ins, which hold when
    # every request fails with a reason) must catch it, starting with a `failures` bound.
    from testbed.scenario.schema import load_scenario
    from tests.chaos.harness import LIBRARY, SCENARIOS

    for name in LIBRARY:
        sc = load_scenario(SCENARIOS / f"{name}.yaml")
        assert any(c.check == "failures" for c in sc.checkers), f"{name}: no failures bound"
        history = [HistoryEvent(0.0, "plan", {"lambda_max_rps": 2.0})]
        for i, ev in enumerate(sc.nemesis):
            history.append(fault(ev.at, ev.action, "start", index=i))
            if ev.end is not None:
                history.append(fault(ev.end, ev.action, "end", index=i))
        failed = [
            rec(i, sc.duration * i / 200, status="failed", failure_reason="x", tokens_out=0)
            for i in range(200)
        ]
        ids = [r.id for r in failed]
        results = run_checkers(failed, ids, history=history, configs=sc.checkers)
        own = results[-len(sc.checkers) :]
        verdicts = {c.name: c.verdict for c in own}
        assert verdicts["failures"] == "failed", (name, verdicts)
        assert "ok" not in verdicts.values(), (name, [(c.name, c.detail) for c in own])
