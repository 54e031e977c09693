"""latency: add `rtt` / 2 of delay (+- `jitter`) on both directions of every link proxy."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from testbed.config import Duration
from testbed.nemesis.fault import ACTIONS, NemesisContext
from testbed.nemesis.link import LinkEvent, ToxicFault, ToxicSpec


class LatencyAction(LinkEvent):
    action: Literal["latency"] = "latency"
    rtt: Duration | None = Field(None, description="round-trip time added to the link")
    jitter: Duration | None = None

    @model_validator(mode="after")
    def _some_delay(self) -> LatencyAction:
        if self.rtt is None and self.jitter is None:
            raise ValueError("action 'latency' needs 'rtt' or 'jitter'")
        return self


@ACTIONS.register
class LatencyFault(ToxicFault[LatencyAction]):
    config = LatencyAction

    def toxics(self, ctx: NemesisContext) -> list[ToxicSpec]:
        attrs = {
            "latency": self._wall_ms(ctx, (self.event.rtt or 0.0) / 2),
            "jitter": self._wall_ms(ctx, self.event.jitter or 0.0),
        }
        return [("latency", s, attrs, 1.0) for s in ("upstream", "downstream")]
