"""bandwidth: limit each connection to `rate` KB/s (Toxiproxy's BandwidthToxic, per connection).

Each connection paces its own bytes with a virtual-clock token bucket, in pieces of a few
milliseconds of link time so slow rates deliver smoothly. Toxiproxy hangs on rate 0 (it loops
splitting the chunk into empty slices); here rate must be > 0 and a 0 is rejected with 400. For a
cap shared by all connections of a proxy use the `link_bandwidth` extension toxic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from testbed.link.errors import bad_request
from testbed.link.pacer import Pacer, piece_size
from testbed.link.pipeline import Chunk, End
from testbed.link.toxics.base import Attr, Toxic

if TYPE_CHECKING:
    from testbed.link.pipeline import Stub


class _State:
    __slots__ = ("pacer",)

    def __init__(self) -> None:
        self.pacer: Pacer | None = None


class BandwidthToxic(Toxic):
    type_name: ClassVar[str] = "bandwidth"
    attrs: ClassVar[tuple[Attr, ...]] = (
        Attr("rate", "int", 0, "KB/s per connection (1 KB = 1000 bytes), > 0", positive=True),
    )

    def configure(self) -> None:
        self.rate_bps = self.values["rate"] * 1000.0  # bytes/s
        if self.rate_bps <= 0:
            # Reached only when "rate" was left out: it has no usable default.
            raise bad_request("attribute 'rate' of a bandwidth toxic must be greater than 0")

    def new_state(self) -> Any:
        return _State()

    async def pipe(self, stub: Stub) -> None:
        loop = stub.loop
        state: _State = stub.state
        if state.pacer is None:
            state.pacer = Pacer(self.rate_bps, loop.time())
        else:
            state.pacer.set_rate(self.rate_bps, loop.time())
        pacer = state.pacer
        piece = piece_size(self.rate_bps)
        while True:
            item = await stub.recv()
            if isinstance(item, End):
                await stub.send(item)
                return
            data = item.data
            n = len(data)
            if n <= piece:
                await stub.sleep_until(pacer.reserve(n, loop.time()))
                await stub.send(item)
                continue
            mv = memoryview(data)
            off = 0
            while off < n:
                k = min(piece, n - off)
                await stub.sleep_until(pacer.reserve(k, loop.time()))
                await stub.send(Chunk(mv[off : off + k], item.ts))
                off += k
