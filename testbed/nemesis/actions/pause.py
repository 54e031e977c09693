"""pause: SIGSTOP the target instances, SIGCONT at the end (`for` is required)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from testbed.config import PositiveDuration
from testbed.nemesis.fault import ACTIONS, NemesisContext
from testbed.nemesis.process import ProcessEvent, ProcessFault


class PauseAction(ProcessEvent):
    action: Literal["pause"] = "pause"
    for_: PositiveDuration = Field(alias="for")


@ACTIONS.register
class PauseFault(ProcessFault[PauseAction]):
    config = PauseAction

    async def start(self, ctx: NemesisContext) -> dict[str, Any]:
        for h in self.handles(ctx):
            await ctx.substrate.pause(h)
        return {"signal": "SIGSTOP"}

    async def end(self, ctx: NemesisContext) -> dict[str, Any]:
        for h in self.handles(ctx):
            await ctx.substrate.resume(h)
        return {"signal": "SIGCONT"}
