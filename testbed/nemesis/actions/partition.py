"""partition: `mode: disable` closes the link proxies (connections reset, new ones refused);
`mode: timeout` black-holes data instead and closes a connection after `timeout` of quiet.
With the kernel shaper (`link.shaper: tc`) both modes also drop every packet crossing the link in
the kernel until the end (the `partition` and `timeout` link verbs, testbed.nemesis.verbs)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import model_validator

from testbed.config import Duration
from testbed.nemesis.event import NemesisEvent
from testbed.nemesis.fault import ACTIONS, NemesisContext
from testbed.nemesis.link import LinkEvent, LinkFault, link_of
from testbed.nemesis.verbs import LinkControl


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
class PartitionFault(LinkFault[PartitionAction]):
    config = PartitionAction
    verbs = frozenset({"partition", "timeout"})

    @classmethod
    def verbs_for(cls, event: NemesisEvent) -> frozenset[str]:
        """`disable` cuts the link (`partition`), `timeout` black-holes it (`timeout`)."""
        assert isinstance(event, PartitionAction)
        return frozenset({"partition" if event.mode == "disable" else "timeout"})

    async def apply(self, link: LinkControl, key: str) -> dict[str, Any]:
        if self.event.mode == "timeout":
            timeout = self.event.timeout or 0.0
            await link.add_timeout(key, timeout_s=timeout)
            return {"mode": "timeout", "timeout_s": timeout}
        await link.partition()
        return {"mode": "disable", "proxies": len(link.proxies)}

    async def end(self, ctx: NemesisContext) -> dict[str, Any]:
        if self.event.mode == "timeout":
            return await super().end(ctx)  # removes the black hole added under its key
        await link_of(ctx).heal()
        return {}
