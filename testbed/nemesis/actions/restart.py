"""restart: kill the target instances and start them again at once (no `for`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import model_validator

from testbed.nemesis.fault import ACTIONS, NemesisContext
from testbed.nemesis.process import ProcessEvent, ProcessFault


class RestartAction(ProcessEvent):
    action: Literal["restart"] = "restart"

    @model_validator(mode="after")
    def _instantaneous(self) -> RestartAction:
        if self.for_ is not None:
            raise ValueError("action 'restart' is instantaneous; use 'kill' with 'for' instead")
        return self


@ACTIONS.register
class RestartFault(ProcessFault[RestartAction]):
    config = RestartAction

    async def start(self, ctx: NemesisContext) -> dict[str, Any]:
        await self._restart(ctx)
        return {"restarted": True}
