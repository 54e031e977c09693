"""bandwidth: set the shared cap of the cross-datacenter link; restore it at the end."""

from __future__ import annotations

from typing import Any, Literal

from testbed.config import Bandwidth
from testbed.nemesis.fault import ACTIONS, Fault, NemesisContext
from testbed.nemesis.link import LinkEvent, link_of


class BandwidthAction(LinkEvent):
    action: Literal["bandwidth"] = "bandwidth"
    bandwidth: Bandwidth
    """The cap while the fault lasts, real-world (e.g. "10Gbps")."""


@ACTIONS.register
class BandwidthFault(Fault[BandwidthAction]):
    config = BandwidthAction
    verbs = frozenset({"bandwidth"})

    async def start(self, ctx: NemesisContext) -> dict[str, Any]:
        link = link_of(ctx)
        self.before = link.configured_bytes_per_s
        await link.set_bandwidth(self.event.bandwidth)
        return {"gbps": self.event.bandwidth * 8 / 1e9, "was_gbps": self.before * 8 / 1e9}

    async def end(self, ctx: NemesisContext) -> dict[str, Any]:
        link = link_of(ctx)
        await link.set_bandwidth(self.before)
        return {"gbps": self.before * 8 / 1e9}
