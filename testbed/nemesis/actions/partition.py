"""partition: `mode: disable` closes the link proxies (connections reset, new ones refused);
`mode: timeout` black-holes data instead and closes a connection after `timeout` of quiet.
With the kernel shaper (`link.shaper: tc`) both modes also drop every packet crossing the link in
the kernel until the end (LinkSetup.partition / heal / blackhole)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import model_validator

from testbed.config import Duration
from testbed.nemesis.fault import ACTIONS, NemesisContext
from testbed.nemesis.link import LinkEvent, ToxicFault, ToxicSpec, link_of


class PartitionAction(LinkEvent):
    action: Literal["partition"] = "partition"
    mode: Literal["disable", "timeout"] = "disable"
    timeout: Duration | None = None
    """mode timeout: quiet time before a connection is closed (never, if 0)."""

    @model_validator(mode="after")
    def _timeout_fits_mode(self) -> PartitionAction:
        if self.mode == "disable" and self.timeout is not None:
            raise ValueError("'timeout' applies to partition mode 'timeout' only")
        return self


@ACTIONS.register
class PartitionFault(ToxicFault[PartitionAction]):
    config = PartitionAction

    def toxics(self, ctx: NemesisContext) -> list[ToxicSpec]:
        timeout_ms = round(self._wall_ms(ctx, self.event.timeout or 0.0))
        return [("timeout", s, {"timeout": timeout_ms}, 1.0) for s in ("upstream", "downstream")]

    async def start(self, ctx: NemesisContext) -> dict[str, Any]:
        if self.event.mode == "timeout":
            link, _ = link_of(ctx)
            await link.blackhole(True)
            return {"mode": "timeout", **await super().start(ctx)}
        link, _ = link_of(ctx)
        await link.partition()
        return {"mode": "disable", "proxies": len(link.proxies)}

    async def end(self, ctx: NemesisContext) -> dict[str, Any]:
        if self.event.mode == "timeout":
            out = await super().end(ctx)
            link, _ = link_of(ctx)
            await link.blackhole(False)
            return out
        link, _ = link_of(ctx)
        await link.heal()
        return {}
