"""slow_close: delay the close of the connection by `delay` ms (Toxiproxy's SlowCloseToxic).

Data passes untouched; when the direction ends (EOF), the end is held for `delay` before it
reaches the other side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from testbed.link.pipeline import End
from testbed.link.toxics.base import Attr, Toxic

if TYPE_CHECKING:
    from testbed.link.pipeline import Stub


class SlowCloseToxic(Toxic):
    type_name: ClassVar[str] = "slow_close"
    attrs: ClassVar[tuple[Attr, ...]] = (
        Attr("delay", "int", 0, "milliseconds to hold the close", minimum=0),
    )

    async def pipe(self, stub: Stub) -> None:
        while True:
            item = await stub.recv()
            if isinstance(item, End):
                await stub.sleep_until(stub.loop.time() + self.values["delay"] / 1000.0)
                await stub.send(item)
                return
            await stub.send(item)
