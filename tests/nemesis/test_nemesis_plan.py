"""Planning a nemesis timeline, without a deployment: targets and groups picked from the seed,
link faults, extra arrivals, whether the timeline fits the run (testbed/nemesis/plan.py, the
actions' planning hooks)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import ValidationError

from testbed.config import FixedLengths, WorkloadConfig
from testbed.errors import ConfigError, UserError
from testbed.nemesis import (
    ACTIONS,
    LinkEvent,
    NemesisEvent,
    ProcessEvent,
    burst_requests,
    check_timeline_fits,
    instance_ids,
    plan_faults,
)
from testbed.nemesis.actions.bandwidth import BandwidthAction
from testbed.nemesis.actions.burst import BurstAction
from testbed.nemesis.actions.kill import KillAction
from testbed.nemesis.actions.partition import PartitionAction
from testbed.nemesis.actions.pause import PauseAction
from testbed.nemesis.actions.restart import RestartAction
from testbed.workload.generate import RequestSpec
from tests.test_registry_entries import examples

IDS = instance_ids(2, 1, 4)


@dataclass
class Timeline:
    nemesis: list[NemesisEvent]
    seed: int = 0
    name: str = "t"
    workload: WorkloadConfig = field(
        default_factory=lambda: WorkloadConfig(lengths=FixedLengths(tokens=1000), output_tokens=8)
    )


def targets(*events: NemesisEvent, seed: int = 0, link: bool = True) -> list[tuple[str, ...]]:
    return [f.targets for f in plan_faults(Timeline(list(events), seed), IDS, link_enabled=link)]


def test_instance_ids_name_the_workers_as_the_runner_does() -> None:
    assert instance_ids(1, 2, 1) == [
        "prfaas-prefill-0",
        "local-prefill-0",
        "local-prefill-1",
        "local-decode-0",
    ]


def test_a_group_target_picks_count_distinct_instances_of_the_group_from_the_seed() -> None:
    kill = KillAction(at=1, target="local-decode", count=2)
    (picked,) = targets(kill, seed=7)
    assert len(set(picked)) == 2 and all(t.startswith("local-decode-") for t in picked)
    assert list(picked) == sorted(picked)
    assert targets(kill, seed=7) == [picked]  # a pure function of the seed
    picks = {targets(kill, seed=s)[0] for s in range(30)}
    assert len(picks) > 1  # ... which does vary the pick
    whole = KillAction(at=1, target="prfaas-prefill", count=2)
    assert targets(whole) == [("prfaas-prefill-0", "prfaas-prefill-1")]


def test_the_fault_index_seeds_its_own_pick() -> None:
    one = KillAction(at=1, target="local-decode")
    # the same entry at index 0 and 1: picks drawn from (seed, 0) and (seed, 1)
    pairs = [tuple(targets(one, one, seed=s)) for s in range(30)]
    assert any(a != b for a, b in pairs)
    # and an entry's pick does not depend on what comes before it
    other = PartitionAction(at=0)
    assert [targets(other, one, seed=s)[1] for s in range(10)] == [
        targets(one, one, seed=s)[1] for s in range(10)
    ]


def test_an_instance_target_is_that_instance_and_an_unknown_one_is_refused() -> None:
    assert targets(PauseAction(at=1, target="local-prefill-0", **{"for": 2})) == [
        ("local-prefill-0",)
    ]
    with pytest.raises(ConfigError) as info:
        targets(RestartAction(at=1, target="local-decode-9"))
    msg = str(info.value)
    assert msg.startswith("scenario 't': nemesis.0.target: no instance 'local-decode-9'")
    assert "local-decode-3" in msg and "\n" not in msg


def test_a_count_beyond_the_group_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"nemesis\.1\.count: 2 exceeds the 1 local-prefill"):
        targets(PartitionAction(at=0), KillAction(at=1, target="local-prefill", count=2))


LINK_ACTIONS = sorted(n for n, f in ACTIONS.items() if issubclass(f.config, LinkEvent))
PROCESS_ACTIONS = sorted(n for n, f in ACTIONS.items() if issubclass(f.config, ProcessEvent))


def test_the_registry_sorts_every_action_into_its_kind_of_target() -> None:
    """The built-in actions land in their kind; an action added since joins the lists by its
    model's base class, with no edit here."""
    assert {"bandwidth", "latency", "partition", "reset_peer", "slow_close"} <= set(LINK_ACTIONS)
    assert {"kill", "pause", "restart"} <= set(PROCESS_ACTIONS)
    assert {"burst", "scheduler-kill", "scheduler-pause", "scheduler-slow"} <= (
        set(ACTIONS) - set(LINK_ACTIONS) - set(PROCESS_ACTIONS)
    )  # bursts add arrivals; the scheduler faults act on the owned scheduler (policy.command)
    assert not set(LINK_ACTIONS) & set(PROCESS_ACTIONS)


def sample(action: str) -> dict[str, Any]:
    """The settings a link action needs: listed for the built-in ones; an action added since
    brings its own example (library, docs or its module docstring: tests/test_registry_entries)."""
    if action in SAMPLE:
        return SAMPLE[action]
    (example, *_) = examples("action", (action,), ACTIONS[action].config)
    return {k: v for k, v in example.items() if k not in ("action", "at", "for")}


SAMPLE: dict[str, dict[str, Any]] = {
    "bandwidth": {"bandwidth": "1Gbps"},
    "latency": {"rtt": "10ms"},
    "partition": {},
    "reset_peer": {"timeout": "1s"},
    "slow_close": {"delay": "1s"},
}


@pytest.mark.parametrize("action", LINK_ACTIONS)
def test_a_link_fault_targets_the_link_and_needs_one(action: str) -> None:
    ev = ACTIONS[action].config.model_validate({"action": action, "at": "1s", **sample(action)})
    assert targets(ev) == [("link",)]
    with pytest.raises(ConfigError, match=rf"nemesis\.0: action '{action}' needs a cross-"):
        targets(ev, link=False)


def test_a_burst_hits_nothing_live_and_plans_with_its_times() -> None:
    burst = BurstAction(at=10, multiplier=3, **{"for": 5})
    (planned,) = plan_faults(Timeline([burst]), IDS, link_enabled=False)
    assert planned.targets == ()
    assert (planned.index, planned.action, planned.start, planned.end) == (0, "burst", 10, 15)
    (cut,) = plan_faults(Timeline([BandwidthAction(at=3, bandwidth=1e9)]), IDS, link_enabled=True)
    assert cut.end is None  # no `for`: permanent


BASE = [RequestSpec(f"r{i:06d}", float(i), 100, 8) for i in range(100)]


def test_burst_arrivals_are_seeded_inside_their_window_and_sorted() -> None:
    bursts = [BurstAction(at=20, multiplier=3, **{"for": 30}), PartitionAction(at=0)]
    a = burst_requests(Timeline(bursts, seed=4), BASE, 1.0, 100.0)
    assert a == burst_requests(Timeline(bursts, seed=4), BASE, 1.0, 100.0)
    assert a != burst_requests(Timeline(bursts, seed=5), BASE, 1.0, 100.0)
    extra = [r for r in a if r not in BASE]
    assert 30 < len(extra) < 95  # Poisson, mean (3 - 1) x 1 req/s x 30 s
    assert all(20 <= r.arrival < 50 for r in extra)
    assert all(r.id.startswith("b0-") and (r.input_tokens, r.output_tokens) == (1000, 8)
               for r in extra)  # fmt: skip
    assert [(r.arrival, r.id) for r in a] == sorted((r.arrival, r.id) for r in a)


def test_a_burst_is_cut_at_the_duration_and_scales_a_traces_mean_rate() -> None:
    late = BurstAction(at=90, multiplier=50, **{"for": 60})
    cut = [r for r in burst_requests(Timeline([late]), BASE, 1.0, 100.0) if r not in BASE]
    assert cut and all(90 <= r.arrival < 100 for r in cut)
    # trace timing (no rate): the base is the trace's mean rate, 100 requests / 100 s
    traced = burst_requests(Timeline([late]), BASE, None, 100.0)
    assert len(traced) - len(BASE) == len(cut)


def test_without_a_burst_the_requests_come_back_untouched() -> None:
    out = burst_requests(Timeline([PartitionAction(at=0)]), BASE, 1.0, 100.0)
    assert out is BASE


def test_a_fault_at_or_after_the_duration_is_refused_and_one_ending_past_it_is_not() -> None:
    cut = PartitionAction(at=50, **{"for": 100})
    tl = Timeline([cut, KillAction(at=100, target="local-decode")])
    with pytest.raises(UserError) as info:
        check_timeline_fits(tl, 100.0)
    assert "nemesis.1 (kill at 100s)" in str(info.value) and "nemesis.0" not in str(info.value)
    check_timeline_fits(tl, 100.5)  # the partition ends at 150 s, past the run: allowed


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: PauseAction(at=1, target="local-decode"), "for"),
        (lambda: BurstAction(at=1, multiplier=2), "for"),
        (lambda: RestartAction(at=1, target="local-decode", **{"for": 1}), "instantaneous"),
        (lambda: KillAction(at=1, target="gpu-7"), "unknown target 'gpu-7'"),
        (lambda: KillAction(at=1, target="local-decode", count=0), "greater than or equal"),
    ],
)
def test_an_actions_model_validates_its_own_fields(build: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        build()


def test_every_action_model_answers_to_its_registered_name() -> None:
    for name, fault in ACTIONS.items():
        assert fault.config.model_fields["action"].default == name
