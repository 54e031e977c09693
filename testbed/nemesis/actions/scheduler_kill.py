"""scheduler-kill: SIGKILL the outside scheduler the scenario owns; with `for`, start it again
when the window ends (a restarted service has lost its deployment copy: the router's next
delta is answered 409 and it resyncs). Meanwhile the fallback policy routes every request."""

from __future__ import annotations

from typing import Any, Literal

from testbed.nemesis.actions.scheduler_control import scheduler_of
from testbed.nemesis.event import NemesisEvent
from testbed.nemesis.fault import ACTIONS, Fault, NemesisContext


class SchedulerKillAction(NemesisEvent):
    action: Literal["scheduler-kill"] = "scheduler-kill"


@ACTIONS.register
class SchedulerKillFault(Fault[SchedulerKillAction]):
    config = SchedulerKillAction

    async def start(self, ctx: NemesisContext) -> dict[str, Any]:
        return await scheduler_of(ctx).kill()

    async def end(self, ctx: NemesisContext) -> dict[str, Any]:
        return await scheduler_of(ctx).restart()
