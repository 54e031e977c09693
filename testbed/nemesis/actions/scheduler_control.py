"""What the scheduler faults (scheduler-kill, scheduler-pause, scheduler-slow) may do to the
outside scheduler a scenario owns (`policy.command`), and how they find it.

The run provides it as `ctx.scheduler` (testbed.scenario.outside.OwnedScheduler on the live
substrates); a run without one refuses these actions before it starts, and a context that has
none (the sim) makes the fault's start an error recorded in its history event.
This module registers no action of its own.
"""

from __future__ import annotations

from typing import Any, Protocol

from testbed.nemesis.fault import NemesisContext

__all__ = ["SchedulerControl", "scheduler_of"]


class SchedulerControl(Protocol):
    async def kill(self) -> dict[str, Any]: ...
    async def restart(self) -> dict[str, Any]: ...
    async def pause(self) -> dict[str, Any]: ...
    async def resume(self) -> dict[str, Any]: ...
    async def slow(self, delay_wall_s: float, /) -> dict[str, Any]: ...
    async def unslow(self) -> dict[str, Any]: ...


def scheduler_of(ctx: NemesisContext) -> SchedulerControl:
    found = getattr(ctx, "scheduler", None)
    if found is None:
        raise RuntimeError("this run owns no outside scheduler (policy.command)")
    return found
