"""kill: SIGKILL the target instances; with `for`, start them again (same id, same ports) at
the end."""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from testbed.nemesis.fault import ACTIONS, NemesisContext
from testbed.nemesis.process import ProcessEvent, ProcessFault


class KillAction(ProcessEvent):
    action: Literal["kill"] = "kill"


@ACTIONS.register
class KillFault(ProcessFault[KillAction]):
    config = KillAction

    async def start(self, ctx: NemesisContext) -> dict[str, Any]:
        await asyncio.gather(*(ctx.substrate.kill(h) for h in self.handles(ctx)))
        return {"signal": "SIGKILL"}

    async def end(self, ctx: NemesisContext) -> dict[str, Any]:
        await self._restart(ctx)
        return {"restarted": True}
