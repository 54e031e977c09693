"""Playing a planned timeline against a live run, on the run's clock, into its history."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from testbed.clock import Clock
from testbed.metrics.records import HistoryEvent
from testbed.nemesis.fault import ACTIONS, Fault, NemesisContext
from testbed.nemesis.link import refuse_unplayable
from testbed.nemesis.plan import PlannedFault

__all__ = ["NemesisPlayer", "stop_player"]

_MAX_STEPS = 10_000
"""Upper bound on timeline steps a player executes (two per fault)."""


class NemesisPlayer:
    """Plays a planned timeline against a live run and records every phase in `history`.

    `clock` reads 0 at the start of the load (the timeline's origin). Run it as a task
    next to the load and cancel it when the load is done: phases not reached are not played
    (the substrate stops everything anyway, resuming paused processes first).

    A fault whose link verbs the run's link cannot play is refused here, before any is played
    (a UserError naming the fault and the substrate), never started to fail as a recorded error.
    """

    def __init__(
        self,
        ctx: NemesisContext,
        faults: Sequence[PlannedFault],
        history: list[HistoryEvent],
        clock: Clock,
    ) -> None:
        if ctx.link is not None:
            refuse_unplayable(faults, ctx.link.verbs)
        self.ctx = ctx
        self.history = history
        self.clock = clock
        self.faults: list[Fault[Any]] = [ACTIONS[pf.action](pf) for pf in faults][: _MAX_STEPS // 2]
        self.locks: dict[str, asyncio.Lock] = {}
        """One per target: steps on the same instance (or the link) never overlap, so a restart
        still in progress is not raced by the next fault on that instance."""

    async def run(self) -> None:
        """Every fault on its own task, so a slow restart never delays another fault."""
        async with asyncio.TaskGroup() as tg:
            for fault in self.faults:
                tg.create_task(self._play(fault))

    async def _play(self, fault: Fault[Any]) -> None:
        pf = fault.planned
        await self.clock.sleep_until(pf.start)
        ok = await self._step(fault, "start", pf.start)
        if pf.end is not None and ok:
            await self.clock.sleep_until(pf.end)
            await self._step(fault, "end", pf.end)

    async def _step(self, fault: Fault[Any], phase: str, at: float) -> bool:
        data: dict[str, Any] = {
            "action": fault.action,
            "phase": phase,
            "target": ",".join(fault.planned.targets) or None,
            "index": fault.planned.index,
            "at": at,
        }
        async with contextlib.AsyncExitStack() as stack:
            for target in sorted(fault.planned.targets):  # sorted: no lock-order deadlock
                await stack.enter_async_context(self.locks.setdefault(target, asyncio.Lock()))
            t = self.clock.now()
            try:
                async with asyncio.timeout(60):
                    step = fault.start if phase == "start" else fault.end
                    data |= await step(self.ctx)
            except Exception as exc:  # a fault that cannot be applied is recorded, not fatal
                data["error"] = f"{type(exc).__name__}: {exc}"
        data["took_s"] = self.clock.now() - t
        self.history.append(HistoryEvent(t, "fault", data))
        return "error" not in data


async def stop_player(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
