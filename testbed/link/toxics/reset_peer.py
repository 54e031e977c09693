"""reset_peer: reset the connection (TCP RST) `timeout` ms after data arrives (Toxiproxy's
ResetToxic).

As in Toxiproxy, the toxic waits for the first chunk (or the end) in its direction, drops it,
waits `timeout`, then aborts both sockets with SO_LINGER 0 so each peer sees "connection reset".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from testbed.link.toxics.base import Attr, Toxic

if TYPE_CHECKING:
    from testbed.link.pipeline import Stub


class ResetPeerToxic(Toxic):
    type_name: ClassVar[str] = "reset_peer"
    attrs: ClassVar[tuple[Attr, ...]] = (
        Attr("timeout", "int", 0, "milliseconds after the first data before the reset", minimum=0),
    )

    async def pipe(self, stub: Stub) -> None:
        await stub.recv()
        await stub.sleep_until(stub.loop.time() + self.values["timeout"] / 1000.0)
        stub.reset_connection()
