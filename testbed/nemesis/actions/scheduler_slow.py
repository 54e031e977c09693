"""scheduler-slow: every answer of the outside scheduler comes `delay` later, through the link
emulator's proxy between the router and the scheduler (a latency toxic on the answers); removed
at the end (`for` is required). `delay` is wall-clock, like the decision timeout it is meant to
be compared with (policy.timeout): a delay above the timeout makes every decision fall back."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from testbed.config import PositiveDuration
from testbed.nemesis.actions.scheduler_control import scheduler_of
from testbed.nemesis.event import NemesisEvent
from testbed.nemesis.fault import ACTIONS, Fault, NemesisContext


class SchedulerSlowAction(NemesisEvent):
    action: Literal["scheduler-slow"] = "scheduler-slow"
    for_: PositiveDuration = Field(alias="for")
    delay: PositiveDuration = Field(description="wall-clock delay added to every answer")


@ACTIONS.register
class SchedulerSlowFault(Fault[SchedulerSlowAction]):
    config = SchedulerSlowAction

    async def start(self, ctx: NemesisContext) -> dict[str, Any]:
        return await scheduler_of(ctx).slow(self.event.delay)

    async def end(self, ctx: NemesisContext) -> dict[str, Any]:
        return await scheduler_of(ctx).unslow()
