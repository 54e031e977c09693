"""A run's layout: the instances it stands up (their ids, clusters and roles), the spec its
scheduler loops are started with, and the events its history starts with.

The run plan decides it once (testbed.scenario.plan: `RunPlan.layout`), and every way of running
a plan reads it from there: the live runner on the local and compose substrates, `testbed up`,
and the sim (through SimInputs). None of them names an instance, works out whether the local
instances switch roles, or builds a SchedulerSpec or the "plan" event itself, so a run on one
substrate has the same instances, loops and starting history as on another.

Instance ids are `<group>-<i>` for the groups a fault targets (testbed.nemesis.process:
`group_ids`): `prfaas-prefill-i`, `local-prefill-i`, `local-decode-i`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from testbed.metrics.records import HistoryEvent
from testbed.scheduler.spec import SchedulerSpec

__all__ = ["Layout"]


@dataclass(frozen=True)
class Layout:
    """The instances and the loops of one run (see the module's doc)."""

    prfaas_prefill: tuple[str, ...]
    """The PrfaaS cluster's prefill instances (none without a cross-datacenter link)."""
    local_prefill: tuple[str, ...]
    """The local cluster's prefill instances (its PD-P share of the split)."""
    local_decode: tuple[str, ...]
    """The local cluster's decode instances (PD-D)."""
    switchable: bool
    """Every local instance can take either role (services/pd.py), its role at start the one
    its id names: a policy that re-plans the split (long-term loop) on a deployment with a
    PrfaaS cluster and the emulated engine (the torch engine has no switchable service yet)."""
    scheduler: SchedulerSpec | None
    """What the router's control loops start with; None: they do not run (a policy that
    neither re-plans nor reads the link)."""
    threshold_tokens: float | None
    """The routing threshold at start (a `policy` event at t=0 when set)."""
    plan_event: Mapping[str, object] = field(default_factory=dict)
    """The planner's optima (before and after a workload shift), the `plan` event at t=0 that
    checkers judge throughput against (testbed.checkers.throughput)."""

    @property
    def workers(self) -> list[str]:
        """Every worker id, PrfaaS prefill first, then local prefill, then local decode: the
        order fault targets are picked from (testbed.nemesis.plan_faults)."""
        return [*self.prfaas_prefill, *self.local_prefill, *self.local_decode]

    def start_events(self) -> list[HistoryEvent]:
        """The events a run's history starts with at t=0 (fresh objects: a history may keep
        and re-time its own): the threshold in force, if any, then the plan."""
        events = []
        if self.threshold_tokens is not None:
            events.append(HistoryEvent(0.0, "policy", {"threshold_tokens": self.threshold_tokens}))
        events.append(HistoryEvent(0.0, "plan", dict(self.plan_event)))
        return events
