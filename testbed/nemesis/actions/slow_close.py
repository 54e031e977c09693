"""slow_close: connection closes through the link are held for `delay`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from testbed.config import Duration
from testbed.nemesis.fault import ACTIONS
from testbed.nemesis.link import LinkEvent, LinkFault
from testbed.nemesis.verbs import LinkControl


class SlowCloseAction(LinkEvent):
    action: Literal["slow_close"] = "slow_close"
    delay: Duration
    toxicity: float = Field(1.0, ge=0, le=1)


@ACTIONS.register
class SlowCloseFault(LinkFault[SlowCloseAction]):
    config = SlowCloseAction
    verbs = frozenset({"slow_close"})

    async def apply(self, link: LinkControl, key: str) -> dict[str, Any]:
        delay = self.event.delay
        await link.add_slow_close(key, delay_s=delay, probability=self.event.toxicity)
        return {"delay_s": delay, "toxicity": self.event.toxicity}
