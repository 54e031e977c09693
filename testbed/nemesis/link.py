"""Link faults: entries that need a cross-datacenter link, faults made of link verbs, and the
refusal of a fault a substrate's link cannot play.

A `LinkFault` adds its verbs under one key at the start (`apply`) and removes that key at the
end; `unplayable` / `refuse_unplayable` compare the verbs a timeline's faults declare
(`Fault.verbs_for`) with what a link plays (`LinkVerbs`), before anything runs.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, TypeVar

from testbed.errors import ConfigError, UserError
from testbed.nemesis.event import NemesisEvent
from testbed.nemesis.fault import ACTIONS, Fault, NemesisContext
from testbed.nemesis.plan import PlannedFault
from testbed.nemesis.verbs import LinkControl, LinkVerbs

__all__ = ["LinkEvent", "LinkFault", "link_of", "refuse_unplayable", "unplayable"]


class LinkEvent(NemesisEvent):
    """An entry whose fault acts on the cross-datacenter link (its target is "link")."""

    def plan_targets(
        self, index: int, ids: Sequence[str], seed: int, where: str, *, link_enabled: bool
    ) -> tuple[str, ...]:
        if not link_enabled:
            raise ConfigError(
                f"{where}: action {self.action!r} needs a cross-datacenter link, and this "
                f"deployment has none"
            )
        return ("link",)


def link_of(ctx: NemesisContext) -> LinkControl:
    """The run's link; a RuntimeError (recorded as the fault's error) when the run has none."""
    link = ctx.link
    if link is None:
        raise RuntimeError("this run has no link emulator")
    return link


L = TypeVar("L", bound=LinkEvent)


class LinkFault(Fault[L]):
    """A fault made of link verbs under its own key: `apply` adds them at the start, the end
    removes everything added under the key (`LinkControl.remove`)."""

    @property
    def key(self) -> str:
        """The key its verbs are added under: "nemesis-<index>-<action>" (the live link's
        toxics are named after it)."""
        return f"nemesis-{self.planned.index}-{self.action}"

    @abstractmethod
    async def apply(self, link: LinkControl, key: str) -> dict[str, Any]:
        """Add the fault's verbs under `key`; returns what it asked (real-world units), which
        goes into the "fault" history event."""

    async def start(self, ctx: NemesisContext) -> dict[str, Any]:
        return await self.apply(link_of(ctx), self.key)

    async def end(self, ctx: NemesisContext) -> dict[str, Any]:
        await link_of(ctx).remove(self.key)
        return {}


def unplayable(faults: Sequence[PlannedFault | NemesisEvent], verbs: LinkVerbs, /) -> str | None:
    """The one line refusing the first fault whose verbs `verbs` lacks, or None when every
    fault can be played: `nemesis[2] 'fragment': the sim cannot play link verb 'slice'
    (docs/sim.md)`. Entries are planned faults, or a scenario's `nemesis:` list in order."""
    for n, item in enumerate(faults):
        index, event = (item.index, item.event) if isinstance(item, PlannedFault) else (n, item)
        missing = sorted(ACTIONS[event.action].verbs_for(event) - verbs.supported)
        if missing:
            return (
                f"nemesis[{index}] {event.action!r}: the {verbs.substrate} cannot play link "
                f"verb {missing[0]!r} ({verbs.doc})"
            )
    return None


def refuse_unplayable(faults: Sequence[PlannedFault | NemesisEvent], verbs: LinkVerbs, /) -> None:
    """`unplayable` as a UserError (one line, exit 2), before anything runs."""
    why = unplayable(faults, verbs)
    if why is not None:
        raise UserError(why)
