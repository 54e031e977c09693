"""scheduler-pause: SIGSTOP the outside scheduler the scenario owns, SIGCONT at the end (`for`
is required). A paused service accepts connections and never answers: every decision waits
out the timeout, then the fallback decides."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from testbed.config import PositiveDuration
from testbed.nemesis.actions.scheduler_control import scheduler_of
from testbed.nemesis.event import NemesisEvent
from testbed.nemesis.fault import ACTIONS, Fault, NemesisContext


class SchedulerPauseAction(NemesisEvent):
    action: Literal["scheduler-pause"] = "scheduler-pause"
    for_: PositiveDuration = Field(alias="for")


@ACTIONS.register
class SchedulerPauseFault(Fault[SchedulerPauseAction]):
    config = SchedulerPauseAction

    async def start(self, ctx: NemesisContext) -> dict[str, Any]:
        return await scheduler_of(ctx).pause()

    async def end(self, ctx: NemesisContext) -> dict[str, Any]:
        return await scheduler_of(ctx).resume()
