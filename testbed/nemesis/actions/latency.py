"""latency: add `rtt` / 2 of delay (+- `jitter`) on both directions of every link proxy."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from testbed.config import Duration
from testbed.nemesis.fault import ACTIONS
from testbed.nemesis.link import LinkEvent, LinkFault
from testbed.nemesis.verbs import LinkControl


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
class LatencyFault(LinkFault[LatencyAction]):
    config = LatencyAction
    verbs = frozenset({"delay"})

    async def apply(self, link: LinkControl, key: str) -> dict[str, Any]:
        rtt, jitter = self.event.rtt or 0.0, self.event.jitter or 0.0
        await link.add_delay(key, rtt_s=rtt, jitter_s=jitter)
        return {"rtt_ms": rtt * 1e3, "jitter_ms": jitter * 1e3}
