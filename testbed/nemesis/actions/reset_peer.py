"""reset_peer: every connection through the link is reset `timeout` after data starts flowing
(TCP RST in the middle of a transfer), for connections picked with probability `toxicity`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from testbed.config import Duration
from testbed.nemesis.fault import ACTIONS, NemesisContext
from testbed.nemesis.link import LinkEvent, ToxicFault, ToxicSpec


class ResetPeerAction(LinkEvent):
    action: Literal["reset_peer"] = "reset_peer"
    timeout: Duration | None = None
    toxicity: float = Field(1.0, ge=0, le=1)


@ACTIONS.register
class ResetPeerFault(ToxicFault[ResetPeerAction]):
    config = ResetPeerAction

    def toxics(self, ctx: NemesisContext) -> list[ToxicSpec]:
        attrs = {"timeout": round(self._wall_ms(ctx, self.event.timeout or 0.0))}
        return [("reset_peer", "upstream", attrs, self.event.toxicity)]
