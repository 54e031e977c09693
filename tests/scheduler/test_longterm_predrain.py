"""Draining ahead of a conversion (issue #18 item 3): instances of the shrinking role stop
taking work while the streak completes, so the conversion does not then wait a minute behind
decodes whose prefill is still queued elsewhere; a broken streak puts them back."""

from __future__ import annotations

from testbed.config import LongTermConfig
from testbed.scheduler.longterm import LongTermController, StagePressure
from tests.scheduler.test_longterm import HOT, _planner
from tests.scheduler.test_loops import FakeClock, _setup

COLD = StagePressure(prefill=0.1, decode=0.1)


def test_draining_starts_predrain_checks_before_the_conversion() -> None:
    ctl = LongTermController(_planner(11.0), n_local=8, sustain=6, predrain=3)
    decisions = [ctl.update(1, HOT) for _ in range(6)]
    assert [d.prepare for d in decisions] == [0, 0, 4, 4, 4, 0]  # 1/7 -> 5/3: four instances
    assert [d.act for d in decisions] == [False] * 5 + [True]
    assert "draining ahead" in decisions[2].reason


def test_no_draining_ahead_without_pressure_or_when_off() -> None:
    cold = LongTermController(_planner(11.0), n_local=8, sustain=6, predrain=3)
    assert all(cold.update(1, COLD).prepare == 0 for _ in range(6))
    off = LongTermController(_planner(11.0), n_local=8, sustain=6, predrain=0)
    assert all(off.update(1, HOT).prepare == 0 for _ in range(5))


def test_a_gain_below_the_bar_stops_draining_ahead() -> None:
    ctl = LongTermController(_planner(9.9), n_local=8, sustain=2, predrain=1, min_gain=0.1)
    assert ctl.update(4, HOT).prepare == 0  # 4/4 is within 3% of the optimum 3/5


async def test_drained_ahead_instances_take_no_work_and_come_back_if_the_streak_breaks() -> None:
    loops, cluster, state = _setup(FakeClock(), long_term=LongTermConfig())
    cluster.work.update(d0=500.0, d1=100.0, d2=300.0)
    loops.drain_ahead(target_prefill=2, count=1)
    assert state.draining == {"d1"} and loops.predrained == {"d1"}
    loops.drain_ahead(target_prefill=2, count=1)  # the same decision again: nothing new
    assert [e.kind for e in state.events] == ["drain_ahead"]
    loops.release_ahead("streak broken")
    assert state.draining == set() and loops.predrained == set()
    assert state.events[-1].data == {"instances": ["d1"], "why": "streak broken"}


async def test_the_conversion_takes_the_instance_drained_ahead_without_waiting() -> None:
    clock = FakeClock()
    loops, cluster, state = _setup(clock, long_term=LongTermConfig(role_switch=0.0))
    cluster.work.update(d0=500.0, d1=100.0, d2=300.0)
    loops.drain_ahead(target_prefill=2, count=1)
    # while drained ahead, d1's queued requests left it; d2 is now the least loaded
    cluster.work.update(d1=0.0, d2=50.0)
    cluster.outstanding.update(d2=2)
    await loops.convert(target_prefill=2)
    assert cluster.switches == [("d1", "prefill", True)]
    switched = [e.data for e in state.events if e.kind == "switched"]
    assert switched[0]["drain_s"] == 0.0
    assert state.draining == set() and loops.predrained == set()


async def test_a_conversion_releases_instances_drained_ahead_it_does_not_need() -> None:
    loops, cluster, state = _setup(FakeClock(), long_term=LongTermConfig(role_switch=0.0))
    loops.drain_ahead(target_prefill=3, count=2)
    assert state.draining == {"d0", "d1"}
    await loops.convert(target_prefill=2)  # the target came back to one conversion
    assert [s[0] for s in cluster.switches] == ["d0"]
    released = [e.data for e in state.events if e.kind == "drain_released"]
    assert released == [{"instances": ["d1"], "why": "not chosen"}]
    assert state.draining == set()
