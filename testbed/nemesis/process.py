"""Process faults: entries that target instances, how their targets are picked, and the fault
base that looks their handles up."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, TypeVar

import numpy as np
from pydantic import AfterValidator, Field

from testbed.errors import ConfigError
from testbed.nemesis.event import NemesisEvent
from testbed.nemesis.fault import Fault, NemesisContext

__all__ = [
    "NEMESIS_TARGET_GROUPS",
    "ProcessEvent",
    "ProcessFault",
    "Target",
    "group_ids",
    "instance_ids",
]

NEMESIS_TARGET_GROUPS = ("prfaas-prefill", "local-prefill", "local-decode")
"""Process-fault targets: a group (`count` of its instances, picked from the seed) or one
instance id such as `local-decode-1`."""


def group_ids(group: str, n: int) -> tuple[str, ...]:
    """The ids of a group's `n` instances, `<group>-<i>`: the one place an instance is named
    (a run's layout, testbed.substrate.layout, names its instances with it)."""
    return tuple(f"{group}-{i}" for i in range(n))


def instance_ids(n_prfaas: int, n_prefill: int, n_decode: int) -> list[str]:
    """The worker ids of a deployment (`Layout.workers`), for a caller with the counts only."""
    counts = dict(zip(NEMESIS_TARGET_GROUPS, (n_prfaas, n_prefill, n_decode), strict=True))
    return [iid for group, n in counts.items() for iid in group_ids(group, n)]


def _nemesis_target(value: str) -> str:
    base, _, index = value.rpartition("-")
    if value in NEMESIS_TARGET_GROUPS or (base in NEMESIS_TARGET_GROUPS and index.isdigit()):
        return value
    raise ValueError(
        f"unknown target {value!r}; use one of {', '.join(NEMESIS_TARGET_GROUPS)} "
        f"or an instance id like 'local-decode-0'"
    )


Target = Annotated[str, AfterValidator(_nemesis_target)]


class ProcessEvent(NemesisEvent):
    """An entry whose fault hits instances: `target` (a group or an instance id) and `count`
    (how many of a group's instances)."""

    target: Target
    count: int = Field(1, ge=1, le=1000)

    def plan_targets(
        self, index: int, ids: Sequence[str], seed: int, where: str, *, link_enabled: bool
    ) -> tuple[str, ...]:
        """One instance as named, or `count` of a group's picked with a generator seeded by
        (seed, index): the same seed always hits the same instances."""
        if self.target not in NEMESIS_TARGET_GROUPS:
            if self.target not in ids:
                raise ConfigError(
                    f"{where}.target: no instance {self.target!r} in this deployment "
                    f"(instances: {', '.join(ids)})"
                )
            return (self.target,)
        group = [i for i in ids if i.rpartition("-")[0] == self.target]
        if self.count > len(group):
            raise ConfigError(
                f"{where}.count: {self.count} exceeds the {len(group)} {self.target} instances "
                f"of this deployment"
            )
        rng = np.random.default_rng([seed, index])
        picked = rng.choice(len(group), size=self.count, replace=False)
        return tuple(group[int(i)] for i in sorted(picked))


P = TypeVar("P", bound=ProcessEvent)


class ProcessFault(Fault[P]):
    """A fault on the planned target instances, through the substrate."""

    def handles(self, ctx: NemesisContext) -> list[Any]:
        return [ctx.services[t] for t in self.planned.targets]

    async def _restart(self, ctx: NemesisContext) -> None:
        for target in self.planned.targets:
            ctx.services[target] = await ctx.substrate.restart(ctx.services[target])
