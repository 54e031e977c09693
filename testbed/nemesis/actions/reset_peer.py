"""reset_peer: every connection through the link is reset `timeout` after data starts flowing
(TCP RST in the middle of a transfer), for connections picked with probability `toxicity`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from testbed.config import Duration
from testbed.nemesis.fault import ACTIONS
from testbed.nemesis.link import LinkEvent, LinkFault
from testbed.nemesis.verbs import LinkControl


class ResetPeerAction(LinkEvent):
    action: Literal["reset_peer"] = "reset_peer"
    timeout: Duration | None = None
    toxicity: float = Field(1.0, ge=0, le=1)


@ACTIONS.register
class ResetPeerFault(LinkFault[ResetPeerAction]):
    config = ResetPeerAction
    verbs = frozenset({"reset"})

    async def apply(self, link: LinkControl, key: str) -> dict[str, Any]:
        after = self.event.timeout or 0.0
        await link.add_reset(key, after_s=after, probability=self.event.toxicity)
        return {"after_s": after, "toxicity": self.event.toxicity}
