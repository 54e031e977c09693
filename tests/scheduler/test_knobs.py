"""Every knob of `policy.short_term` and `policy.long_term` changes a decision: each is moved
alone against the pure controller that reads it (scheduler.shortterm, .balance, .longterm) or
against the loops (scheduler.loops) with a fake clock and a fake router, and the loops are
shown to hand the controllers the scenario's values. No processes, no sockets."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest

from testbed.clock import Scale
from testbed.config import (
    DeploymentConfig,
    FixedLengths,
    LognormalLengths,
    LongTermConfig,
    ShortTermConfig,
)
from testbed.scheduler import loops as loops_module
from testbed.scheduler.balance import QueueBalance
from testbed.scheduler.cluster import SenderCounters
from testbed.scheduler.longterm import LongTermController, StagePressure
from testbed.scheduler.loops import ControlLoops
from testbed.scheduler.shortterm import ThresholdController
from testbed.scheduler.spec import SchedulerSpec
from testbed.scheduler.state import SchedulerState
from testbed.workload.build import length_distribution

GBPS = 1e9 / 8


@dataclass(frozen=True)
class Plan:
    """The two numbers ThresholdController reads of a StagePlan."""

    threshold_tokens: float
    egress_gbps: float


def plan_at(bandwidth: float) -> Plan:
    """A thinner link pushes t up (fewer prompts offloaded); egress 50 Gbps whatever the link."""
    return Plan(10_000 * (100 * GBPS) / bandwidth, 50.0)


def controller(**knobs: float) -> ThresholdController:
    return ThresholdController(plan_at, 100 * GBPS, **knobs)  # type: ignore[arg-type]


def test_replan_change_is_how_far_the_bandwidth_moves_before_a_replan() -> None:
    assert not controller(replan_change=0.2).update(10, 85 * GBPS).changed
    assert controller(replan_change=0.1).update(10, 85 * GBPS).changed


def test_min_t_change_is_the_smallest_new_threshold_adopted() -> None:
    assert not controller(min_t_change=0.5).update(10, 70 * GBPS).changed
    moved = controller(min_t_change=0.05).update(10, 70 * GBPS)
    assert moved.changed and moved.threshold_tokens == pytest.approx(10_000 / 0.7)


def test_cooldown_holds_the_threshold_after_a_change() -> None:
    for cooldown, second_change in ((2.0, False), (0.5, True)):
        ctl = controller(cooldown_s=cooldown)
        assert ctl.update(10, 50 * GBPS).changed
        assert ctl.update(11, 100 * GBPS).changed is second_change


def test_scarce_utilisation_is_the_egress_share_that_counts_as_scarce() -> None:
    assert not controller(scarce_utilisation=0.7).scarce  # 50 of 100 Gbps planned
    assert controller(scarce_utilisation=0.4).scarce


def test_balance_margin_step_and_max_bias() -> None:
    assert QueueBalance(margin_s=2.0).update(3.0, 0.0) > 1.0
    assert QueueBalance(margin_s=5.0).update(3.0, 0.0) == 1.0  # inside the margin
    assert QueueBalance(step=1.5).update(10.0, 0.0) == 1.5
    assert QueueBalance(step=1.1).update(10.0, 0.0) == pytest.approx(1.1)
    capped = QueueBalance(step=2.0, max_bias=3.0)
    for _ in range(5):
        capped.update(10.0, 0.0)
    assert capped.bias == 3.0


HOT = StagePressure(prefill=0.5, decode=0.5)


@dataclass(frozen=True)
class Split:
    """The two numbers LongTermController reads of a StagePlan: more PD-P is better."""

    n_prefill: int
    lambda_max_rps: float


def split_plan(n: int | None) -> Split:
    n = 3 if n is None else n
    return Split(n, {1: 1.0, 2: 1.05, 3: 1.5}[n])


def long_term(**knobs: Any) -> LongTermController:
    return LongTermController(split_plan, n_local=4, **knobs)  # type: ignore[arg-type]


def test_min_gain_sustain_and_pressure_gate_a_conversion() -> None:
    assert long_term(min_gain=0.1, sustain=1, pressure=0.1).update(1, HOT).act
    assert not long_term(min_gain=0.6, sustain=1, pressure=0.1).update(1, HOT).act  # +50% only
    slow = long_term(sustain=3, pressure=0.1)
    assert [slow.update(1, HOT).act for _ in range(3)] == [False, False, True]
    assert not long_term(sustain=1, pressure=0.8).update(1, HOT).act  # 0.5 < 0.8


# ------------------------------------------------------------------ the loops read the knobs

DEP = DeploymentConfig.model_validate(
    {
        "kind": "prfaas-pd",
        "prfaas": {"hardware": "h200x8", "instances": 1},
        "local": {"hardware": "h20x8", "instances": 3, "prefill": 1},
        "link": {"bandwidth": "100Gbps"},
    }
)


class StepClock:
    """Real-world time that moves only when a loop sleeps; records each sleep and holds the
    loop forever after `sleeps` of them."""

    def __init__(self, sleeps: int = 1) -> None:
        self.t = 100.0
        self.sleeps: list[float] = []
        self.limit = sleeps

    def now(self) -> float:
        return self.t

    def real(self, wall_s: float) -> float:
        return wall_s

    async def sleep(self, real_s: float) -> None:
        if len(self.sleeps) >= self.limit:
            await asyncio.Event().wait()
        self.sleeps.append(real_s)
        self.t += real_s
        await asyncio.sleep(0)


@dataclass(frozen=True)
class Inst:
    id: str
    cluster: str
    role: str
    switchable: bool = False


class Cluster:
    def __init__(self) -> None:
        insts = [Inst("p0", "prfaas", "prefill"), Inst("l0", "local", "prefill")]
        insts += [Inst(f"d{i}", "local", "decode", switchable=True) for i in range(2)]
        self.instances = {i.id: i for i in insts}
        self.healthy = dict.fromkeys(self.instances, True)
        self.outstanding = dict.fromkeys(self.instances, 0)
        self.work = dict.fromkeys(self.instances, 0.0)
        self.switch_s: list[float] = []

    async def sender_stats(self, instances: Sequence[str]) -> list[SenderCounters | None]:
        return [None for _ in instances]

    async def switch_role(self, instance: str, role: str, switch_s: float) -> bool:
        self.switch_s.append(switch_s)
        self.instances[instance] = replace(self.instances[instance], role=role)
        return True


def loops_for(
    clock: StepClock, short: ShortTermConfig | None = None, long: LongTermConfig | None = None
) -> tuple[ControlLoops, Cluster]:
    spec = SchedulerSpec(
        deployment=DEP,
        lengths=FixedLengths(tokens=20_000),
        output_tokens=512,
        tpot_slo_s=0.025,
        threshold_step=1000,
        n_prefill=1,
        short_term=short or ShortTermConfig(),
        long_term=long,
        n_local=3,
    )
    cluster = Cluster()
    state = SchedulerState(clock, threshold=None)  # type: ignore[arg-type]
    return ControlLoops(spec, cluster, state, clock, Scale()), cluster  # type: ignore[arg-type]


async def _run_until(task: asyncio.Task[None], done: Any) -> None:
    for _ in range(2000):  # bounded: the fake clock holds the loop once it has slept enough
        if done() or task.done():
            break
        await asyncio.sleep(0.005)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_the_short_term_loop_hands_its_knobs_to_the_controllers() -> None:
    short = ShortTermConfig(
        interval=4.0, replan_change=0.3, min_t_change=0.2, cooldown=6.0, scarce_utilisation=0.5,
        balance_margin=3.0, balance_step=1.3, max_bias=2.0,
    )  # fmt: skip
    clock = StepClock(sleeps=1)
    loops, _ = loops_for(clock, short)
    task = asyncio.create_task(loops.run_short_term())
    await _run_until(task, lambda: clock.sleeps)
    assert clock.sleeps == [4.0]  # interval
    ctl = loops.ctl
    assert ctl is not None
    assert (ctl.replan_change, ctl.min_t_change, ctl.cooldown_s, ctl.scarce_utilisation) == (
        0.3, 0.2, 6.0, 0.5,
    )  # fmt: skip
    assert loops.balance is not None
    assert (loops.balance.margin_s, loops.balance.step, loops.balance.max_bias) == (3.0, 1.3, 2.0)
    off, _ = loops_for(StepClock(), ShortTermConfig(queue_balance=False))
    assert off.balance is None


async def test_the_long_term_loop_hands_its_knobs_to_the_controller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[dict[str, Any]] = []

    class Recording(LongTermController):
        def __init__(self, *args: Any, **kw: Any) -> None:
            made.append(kw)
            super().__init__(*args, **kw)

    monkeypatch.setattr(loops_module, "LongTermController", Recording)
    long = LongTermConfig(interval=7.0, min_gain=0.3, sustain=2, pressure=0.4, predrain=1)
    clock = StepClock(sleeps=1)
    loops, _ = loops_for(clock, long=long)
    task = asyncio.create_task(loops.run_long_term())
    await _run_until(task, lambda: made and loops.state.events)
    assert clock.sleeps == [7.0]  # interval
    assert made == [{"min_gain": 0.3, "sustain": 2, "pressure": 0.4, "predrain": 1}]


async def test_window_and_min_samples_pick_the_lengths_the_planner_sees() -> None:
    def mean_seen(long: LongTermConfig) -> float:
        loops, _ = loops_for(StepClock(), long=long)
        loops.observe(10.0, 1_000)  # 90 s before now
        loops.observe(95.0, 3_000)
        return loops.lengths().mean()

    configured = 20_000
    assert mean_seen(LongTermConfig(min_samples=3)) == configured  # too few: the scenario's
    assert mean_seen(LongTermConfig(min_samples=1, window=200.0)) == 2_000
    assert mean_seen(LongTermConfig(min_samples=1, window=10.0)) == 3_000


async def test_role_switch_is_the_time_each_conversion_is_given() -> None:
    loops, cluster = loops_for(StepClock(), long=LongTermConfig(role_switch=11.0))
    await loops.convert(target_prefill=2)
    assert cluster.switch_s == [11.0]


def test_the_loops_plan_with_the_specs_deployment_lengths_output_slo_and_step() -> None:
    def planned(**over: Any) -> tuple[float | None, int, int, float]:
        loops, _ = loops_for(StepClock())
        loops.sch = loops.sch.model_copy(update={"lengths": LognormalLengths(), **over})
        loops.dep = loops.sch.deployment
        loops.arrived.configured = length_distribution(loops.sch.lengths)
        plan = loops.plan(loops.bandwidth(), loops.sch.n_prefill, loops.inputs())
        return plan.threshold_tokens, plan.bs_max, plan.n_prefill, plan.lambda_max_rps

    base = planned()
    assert planned(n_prefill=2)[2] == 2 != base[2]
    assert planned(threshold_step=7000)[0] != base[0]
    assert planned(lengths=LognormalLengths(mu=11.0))[0] != base[0]
    assert planned(tpot_slo_s=0.1)[1] > base[1]
    assert planned(output_tokens=8192)[3] < base[3]
    thin = DEP.model_copy(update={"link": DEP.link.model_copy(update={"bandwidth": 1e8})})
    assert planned(deployment=thin)[0] != base[0]


async def test_n_local_is_the_pd_cluster_a_conversion_splits() -> None:
    loops, _ = loops_for(StepClock(), long=LongTermConfig())
    loops.sch = loops.sch.model_copy(update={"n_local": 5})
    await loops.convert(target_prefill=2)
    assert loops.state.events[-1].data["n_decode"] == 5 - 2
