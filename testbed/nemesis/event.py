"""The entry of a nemesis timeline: the base model every action's scenario model derives from.

An action's model (one per file under testbed/nemesis/actions/) narrows `action` to its own
`Literal["name"]`, which is the tag of the scenario's `nemesis:` union, adds its fields with
their validation, and may override the two planning hooks: `plan_targets` (what the fault hits,
resolved before the run) and `extra_requests` (arrivals the fault adds, generated when the run
is prepared).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import ConfigDict, Field

from testbed.config import Duration, PositiveDuration, StrictModel, WorkloadConfig
from testbed.workload.generate import RequestSpec

__all__ = ["BaseLoad", "NemesisEvent"]


@dataclass(frozen=True)
class BaseLoad:
    """What an action that adds arrivals draws them from (see `NemesisEvent.extra_requests`)."""

    seed: int
    """The scenario's seed: draw from generators seeded with (seed, fault index)."""
    rate_rps: float
    """The run's base arrival rate (a trace's mean rate when the arrivals come from a trace)."""
    duration_s: float
    """Arrivals end here."""
    workload: WorkloadConfig


class NemesisEvent(StrictModel):
    """One fault on the nemesis timeline, in real-world seconds since the load started.

    `at` is when it starts; `for` how long it lasts (then it is undone: the link restored, a
    killed worker restarted, a paused one resumed). Without `for` a link fault or a kill is
    permanent. Which fields an action takes: its model (testbed/nemesis/actions/), summed up in
    docs/scenarios.md.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    action: str
    """Narrowed by every action's model to `Literal["<its name>"]`: the union's tag."""
    at: Duration
    for_: PositiveDuration | None = Field(None, alias="for")

    @property
    def end(self) -> float | None:
        return None if self.for_ is None else self.at + self.for_

    def plan_targets(
        self, index: int, ids: Sequence[str], seed: int, where: str, *, link_enabled: bool
    ) -> tuple[str, ...]:
        """What the fault hits, resolved before the run (a pure function of the seed): instance
        ids for process faults, ("link",) for link faults, () for what touches neither (a
        burst). `ids` are the deployment's instances; `where` starts an error message
        (ConfigError) naming the scenario and the entry."""
        return ()

    def extra_requests(self, index: int, load: BaseLoad) -> list[RequestSpec] | None:
        """Requests this fault adds to the run, generated when the run is prepared; None (the
        default) when it adds none. Ids must not collide with the workload's ("r...")."""
        return None
