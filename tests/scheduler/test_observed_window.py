"""The planner's observed-lengths window (`ControlLoops.lengths`): the scan that walks back from
the newest arrival (used while arrivals come in time order, as on the sim) picks the same
lengths, in the same order, as reading every arrival; out of order, every arrival is read."""

from __future__ import annotations

import random
from collections import deque

import pytest

from testbed.clock import Scale
from testbed.config import DeploymentConfig, LognormalLengths
from testbed.scheduler.loops import ControlLoops
from testbed.scheduler.observed import tail_since
from testbed.scheduler.spec import SchedulerSpec
from testbed.scheduler.state import SchedulerState
from testbed.workload.lengths import EmpiricalLengths

DEP = DeploymentConfig.model_validate(
    {
        "kind": "prfaas-pd",
        "prfaas": {"hardware": "h200x8", "instances": 1},
        "local": {"hardware": "h20x8", "instances": 2, "prefill": 1, "decode": 1},
        "link": {"bandwidth": "100Gbps"},
    }
)


class Clock:
    t = 0.0

    def now(self) -> float:
        return self.t


def loops(clock: Clock) -> ControlLoops:
    spec = SchedulerSpec(
        deployment=DEP, lengths=LognormalLengths(), output_tokens=1024, tpot_slo_s=0.025,
        threshold_step=500, n_prefill=1, n_local=2,
    )  # fmt: skip
    state = SchedulerState(clock, threshold=None)  # type: ignore[arg-type]
    return ControlLoops(spec, object(), state, clock, Scale())  # type: ignore[arg-type]


@pytest.mark.parametrize("shuffled", [False, True])
@pytest.mark.parametrize("seed", range(5))
def test_the_window_is_every_arrival_since_the_cutoff(shuffled: bool, seed: int) -> None:
    rng = random.Random(seed)
    clock = Clock()
    lo = loops(clock)
    times = sorted(rng.uniform(0, 200) for _ in range(rng.randint(0, 400)))
    if shuffled and len(times) > 1:
        times[0], times[-1] = times[-1], times[0]  # one late observation is enough
    for t in times:
        lo.observe(t, rng.randint(1, 100_000))
    assert lo.arrived.in_order == (times == sorted(times))
    for now in (0.0, 50.0, 150.0, 199.0, 230.0, 500.0):
        clock.t = now
        want = [n for t, n in lo.arrived.observed if t >= now - lo.window]
        assert lo.arrived.since(now - lo.window) == want
        got = lo.lengths()
        if len(lo.arrived.observed) < lo.arrived.min_samples:
            assert got is lo.arrived.configured
        elif len(want) >= lo.arrived.min_samples:
            assert got == EmpiricalLengths.of(want)


@pytest.mark.parametrize("seed", range(5))
def test_the_tail_scan_reads_what_a_full_scan_reads(seed: int) -> None:
    """`tail_since` (the bandwidth estimates' sustain window too) on entries in time order."""
    rng = random.Random(seed)
    entries: deque[tuple[float, float]] = deque(maxlen=50)
    for _ in range(rng.randint(0, 120)):
        last = entries[-1][0] if entries else 0.0
        entries.append((last + rng.choice([0.0, 0.5, 1.0]), rng.random()))
    for cutoff in (-1.0, 0.0, 10.0, 30.0, 1e9):
        assert tail_since(entries, cutoff) == [b for t, b in entries if t >= cutoff]
