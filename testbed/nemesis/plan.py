"""Planning a nemesis timeline before anything runs: targets, extra arrivals, whether it fits.

`plan_faults` turns a scenario's `nemesis:` list into a fixed timeline (times in real-world
seconds, the exact instances each process fault hits, picked from the scenario's seed and the
fault's index), so the same seed always gives the same faults; `burst_requests` adds the arrivals
faults bring (a burst's), and `check_timeline_fits` refuses a fault that could never be applied.
Everything here is a pure function of the scenario, so it runs without a deployment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from testbed.config import WorkloadConfig
from testbed.errors import UserError
from testbed.nemesis.event import BaseLoad, NemesisEvent
from testbed.workload.generate import RequestSpec

__all__ = [
    "PlannedFault",
    "Timeline",
    "TimelineWithLoad",
    "burst_requests",
    "check_timeline_fits",
    "plan_faults",
]


class Timeline(Protocol):
    """What planning reads of a scenario (testbed.scenario.schema.Scenario has it all)."""

    @property
    def name(self) -> str: ...

    @property
    def seed(self) -> int: ...

    @property
    def nemesis(self) -> Sequence[NemesisEvent]: ...


class TimelineWithLoad(Timeline, Protocol):
    @property
    def workload(self) -> WorkloadConfig: ...


@dataclass(frozen=True)
class PlannedFault:
    """One fault of the timeline with its targets resolved; times in real-world seconds."""

    index: int
    event: NemesisEvent
    targets: tuple[str, ...]
    """Instance ids for process faults; ("link",) for link faults; () for bursts."""

    @property
    def action(self) -> str:
        return self.event.action

    @property
    def start(self) -> float:
        return self.event.at

    @property
    def end(self) -> float | None:
        return self.event.end


def plan_faults(
    scenario: Timeline, ids: Sequence[str], *, link_enabled: bool
) -> list[PlannedFault]:
    """Resolve the scenario's nemesis into a fixed timeline (a pure function of the seed)."""
    out: list[PlannedFault] = []
    for i, ev in enumerate(scenario.nemesis):
        where = f"scenario {scenario.name!r}: nemesis.{i}"
        targets = ev.plan_targets(i, ids, scenario.seed, where, link_enabled=link_enabled)
        out.append(PlannedFault(i, ev, targets))
    return out


def check_timeline_fits(scenario: Timeline, duration_s: float) -> None:
    """Refuse, before anything starts, a timeline with a fault that starts at or after the end
    of the arrivals: it would never be applied (or apply to an idle deployment) and its
    checkers could only say so afterwards. A fault that starts inside the run and ends past it
    is allowed: it is applied, and it ends during the drain or not at all (a `recover` checker
    over it is then vacuous)."""
    late = [
        f"nemesis.{i} ({ev.action} at {ev.at:g}s)"
        for i, ev in enumerate(scenario.nemesis)
        if ev.at >= duration_s
    ]
    if late:
        raise UserError(
            f"scenario {scenario.name!r}: {', '.join(late)} starts at or after the run's "
            f"duration of {duration_s:g}s, so it would exercise nothing; raise --duration or "
            "move the fault"
        )


def burst_requests(
    scenario: TimelineWithLoad,
    requests: list[RequestSpec],
    rate_rps: float | None,
    duration_s: float,
) -> list[RequestSpec]:
    """The run's requests plus the arrivals every fault adds (a burst's), sorted by arrival.

    `rate_rps` is the workload's base rate; None for trace timing, where the trace's mean rate
    over the run stands in. The requests come back unchanged when no fault adds arrivals.
    """
    base = rate_rps
    if base is None:
        base = len(requests) / duration_s if duration_s > 0 else 0.0
    load = BaseLoad(scenario.seed, base, duration_s, scenario.workload)
    added = [ev.extra_requests(i, load) for i, ev in enumerate(scenario.nemesis)]
    if all(extra is None for extra in added):
        return requests
    extra = [r for batch in added if batch is not None for r in batch]
    return sorted([*requests, *extra], key=lambda r: (r.arrival, r.id))
