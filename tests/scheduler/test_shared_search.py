"""The two loops share their work when they plan at one instant (`ControlLoops.inputs`,
`ControlLoops.plan`): every `window` the short-term loop's workload refresh falls on a
long-term check, with the same observed lengths and, on an unnarrowed link, the same
bandwidth. The refresh then asks the check's search for the running split instead of searching
again, and gets the plan a search of its own would give."""

from __future__ import annotations

import random

import pytest

import testbed.scheduler.loops as loops_module
from testbed.clock import Scale
from testbed.config import DeploymentConfig, LognormalLengths
from testbed.planner import SplitSearch, plan_deployment
from testbed.scheduler.loops import ControlLoops
from testbed.scheduler.spec import SchedulerSpec
from testbed.scheduler.state import SchedulerState

DEP = DeploymentConfig.model_validate(
    {
        "kind": "prfaas-pd",
        "prfaas": {"hardware": "h200x8", "instances": 2},
        "local": {"hardware": "h20x8", "instances": 6, "prefill": 2, "decode": 4},
        "link": {"bandwidth": "100Gbps"},
    }
)
NOMINAL = DEP.link.bandwidth


class Clock:
    t = 0.0

    def now(self) -> float:
        return self.t


def _loops(clock: Clock, min_samples: int = 20) -> ControlLoops:
    spec = SchedulerSpec(
        deployment=DEP, lengths=LognormalLengths(), output_tokens=1024, tpot_slo_s=0.025,
        threshold_step=500, n_prefill=2, n_local=6,
    )  # fmt: skip
    state = SchedulerState(clock, threshold=None)  # type: ignore[arg-type]
    loops = ControlLoops(spec, object(), state, clock, Scale())  # type: ignore[arg-type]
    loops.arrived.min_samples = min_samples
    rng = random.Random(7)
    for i in range(60):
        loops.observe(i * 0.25, rng.randint(200, 60_000))
    clock.t = 15.0
    return loops


def test_inputs_are_one_object_until_time_moves_or_a_request_arrives() -> None:
    clock = Clock()
    loops = _loops(clock)
    first = loops.inputs()
    assert loops.inputs() is first
    loops.observe(clock.t, 5_000)
    after_arrival = loops.inputs()
    assert after_arrival is not first
    assert after_arrival.lengths.mean() != first.lengths.mean()  # it counts the arrival
    clock.t += 1.0
    assert loops.inputs() is not after_arrival


def _check(loops: ControlLoops, bandwidth: float) -> SplitSearch:
    """What a long-term check leaves behind: its search, asked for the free split and the
    running one (as `LongTermController.update` asks)."""
    search = SplitSearch("prfaas-pd", DEP, loops.inputs(), link_bytes_per_s=bandwidth)
    search.plan(None)
    search.plan(loops.n_prefill)
    loops._search = search
    return search


def test_a_replan_at_the_checks_instant_asks_its_search_and_plans_alike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    loops = _loops(clock)
    _check(loops, NOMINAL)
    inputs = loops.inputs()
    afresh = plan_deployment(
        "prfaas-pd", DEP, inputs, link_bytes_per_s=NOMINAL, n_prefill=loops.n_prefill
    )

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("searched again")

    monkeypatch.setattr(loops_module, "plan_deployment", refused)
    shared = loops.plan(NOMINAL, loops.n_prefill, loops.inputs())
    assert shared == afresh
    assert shared.threshold_tokens == afresh.threshold_tokens


@pytest.mark.parametrize("moved", ["bandwidth", "arrival", "time"])
def test_a_replan_with_other_inputs_or_bandwidth_searches_afresh(
    moved: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    loops = _loops(clock)
    _check(loops, NOMINAL)
    bandwidth = NOMINAL
    if moved == "bandwidth":
        bandwidth = NOMINAL / 3
    elif moved == "arrival":
        loops.observe(clock.t, 90_000)
    else:
        clock.t += 1.0
    calls: list[float] = []
    real = loops_module.plan_deployment

    def counted(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        calls.append(kwargs["link_bytes_per_s"])  # type: ignore[arg-type]
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(loops_module, "plan_deployment", counted)
    inputs = loops.inputs()
    planned = loops.plan(bandwidth, loops.n_prefill, inputs)
    assert calls == [bandwidth]
    assert planned == real(
        "prfaas-pd", DEP, inputs, link_bytes_per_s=bandwidth, n_prefill=loops.n_prefill
    )
