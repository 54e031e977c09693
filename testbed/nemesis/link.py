"""Link faults: entries that need a cross-datacenter link, and faults made of link toxics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from testbed.errors import ConfigError
from testbed.nemesis.event import NemesisEvent
from testbed.nemesis.fault import Fault, LinkControl, NemesisContext, ToxicControl

__all__ = ["LinkEvent", "ToxicFault", "ToxicSpec", "link_of"]

ToxicSpec = tuple[str, str, dict[str, Any], float]
"""(type, stream, attributes, toxicity) of one toxic."""


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


def link_of(ctx: NemesisContext) -> tuple[LinkControl, ToxicControl]:
    """The run's link and its emulator's API; a RuntimeError (recorded as the fault's error)
    when the run has none."""
    link = ctx.link
    client = link.client if link is not None else None
    if link is None or client is None:
        raise RuntimeError("this run has no link emulator")
    return link, client


L = TypeVar("L", bound=LinkEvent)


class ToxicFault(Fault[L]):
    """A fault that adds toxics to every link proxy at the start and removes them at the end."""

    def toxics(self, ctx: NemesisContext) -> list[ToxicSpec]:
        """(type, stream, attributes, toxicity) of each toxic to add to every proxy."""
        raise NotImplementedError

    def _name(self, n: int) -> str:
        return f"nemesis-{self.planned.index}-{self.action}-{n}"

    async def start(self, ctx: NemesisContext) -> dict[str, Any]:
        link, client = link_of(ctx)
        specs = self.toxics(ctx)
        for proxy in link.proxies:
            for n, (kind, stream, attrs, toxicity) in enumerate(specs):
                await client.add_toxic(
                    proxy,
                    kind,
                    name=self._name(n),
                    stream=stream,
                    attributes=attrs,
                    toxicity=toxicity,
                )
        return {"toxics": [{"type": k, "stream": s, **a} for k, s, a, _ in specs]}

    async def end(self, ctx: NemesisContext) -> dict[str, Any]:
        link, client = link_of(ctx)
        for proxy in link.proxies:
            for n in range(len(self.toxics(ctx))):
                await client.remove_toxic(proxy, self._name(n))
        return {}
