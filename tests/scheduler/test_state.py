"""The scheduler's state object: events numbered in order and replayable, policy changes
announced to listeners only when the inputs change (scheduler.state)."""

from __future__ import annotations

from testbed.scheduler.state import POLICY, SchedulerEvent, SchedulerState


class StillClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t


def test_events_are_numbered_kept_and_replayed_after_a_seq() -> None:
    clock = StillClock()
    state = SchedulerState(clock, threshold=1000.0)  # type: ignore[arg-type]
    heard: list[SchedulerEvent] = []
    stop = state.listen(heard.append)
    clock.t = 1.5
    a = state.record("threshold", threshold_tokens=1000.0, why="start")
    clock.t = 2.5
    b = state.record("split", n_prefill=2)
    assert (a.seq, a.t, b.seq, b.t) == (1, 1.5, 2, 2.5)
    assert heard == [a, b]
    assert state.since(0) == [a, b] and state.since(1) == [b] and state.since(2) == []
    assert b.to_json() == {"seq": 2, "t": 2.5, "kind": "split", "n_prefill": 2}
    stop()
    state.record("drain", instance="x")
    assert len(heard) == 2  # stopped listening


def test_policy_changes_are_announced_once_and_not_kept() -> None:
    state = SchedulerState(StillClock(), threshold=1000.0)  # type: ignore[arg-type]
    heard: list[SchedulerEvent] = []
    state.listen(heard.append)
    state.set_policy(1000.0, False)  # unchanged: nothing to say
    assert heard == []
    state.bandwidth_estimate = 5e9 / 8
    state.set_policy(2000.0, True)
    state.set_policy(2000.0, True)
    (event,) = heard
    assert event.kind == POLICY
    assert event.data == {
        "threshold_tokens": 2000.0,
        "bandwidth_scarce": True,
        "bandwidth_estimate_gbps": 5.0,
    }
    assert state.events == []  # state, not a decision: a late reader asks policy_event()
    now = state.policy_event()
    assert now.seq == state.seq == event.seq and now.data == event.data
