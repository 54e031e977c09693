"""slow_close: connection closes through the link are held for `delay`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from testbed.config import Duration
from testbed.nemesis.fault import ACTIONS, NemesisContext
from testbed.nemesis.link import LinkEvent, ToxicFault, ToxicSpec


class SlowCloseAction(LinkEvent):
    action: Literal["slow_close"] = "slow_close"
    delay: Duration
    toxicity: float = Field(1.0, ge=0, le=1)


@ACTIONS.register
class SlowCloseFault(ToxicFault[SlowCloseAction]):
    config = SlowCloseAction

    def toxics(self, ctx: NemesisContext) -> list[ToxicSpec]:
        attrs = {"delay": round(self._wall_ms(ctx, self.event.delay))}
        return [("slow_close", s, attrs, self.event.toxicity) for s in ("upstream", "downstream")]
