"""timeout: drop all data, and close the connection after `timeout` ms (Toxiproxy's TimeoutToxic).

As in Toxiproxy's Go source, the timer restarts whenever data arrives (and is dropped), so the
connection closes once it has been quiet for `timeout`; with timeout 0 it never closes on its own
and data is dropped until the toxic is removed. Removing the toxic closes the connections it held
(Toxiproxy's Cleanup), because the bytes it dropped have already broken the stream.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, ClassVar

from testbed.link.pipeline import CLOSE, End
from testbed.link.toxics.base import Attr, Toxic

if TYPE_CHECKING:
    from testbed.link.pipeline import Stub


class TimeoutToxic(Toxic):
    type_name: ClassVar[str] = "timeout"
    attrs: ClassVar[tuple[Attr, ...]] = (
        Attr("timeout", "int", 0, "milliseconds of quiet before closing; 0 = never", minimum=0),
    )
    closes_on_removal: ClassVar[bool] = True

    async def pipe(self, stub: Stub) -> None:
        timeout = self.values["timeout"] / 1000.0
        while True:
            if timeout > 0:
                try:
                    item = await asyncio.wait_for(stub.recv(), timeout)
                except TimeoutError:
                    await stub.send(CLOSE)
                    return
            else:
                item = await stub.recv()
            if isinstance(item, End):
                await stub.send(item)
                return
            # Drop the data on the ground.
