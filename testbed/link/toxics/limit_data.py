"""limit_data: close the connection once `bytes` bytes have passed (Toxiproxy's LimitDataToxic).

The count is per connection and direction and survives updates of the toxic; the chunk that
crosses the limit is cut so exactly `bytes` bytes get through, then the connection closes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from testbed.link.pipeline import CLOSE, Chunk, End
from testbed.link.toxics.base import Attr, Toxic

if TYPE_CHECKING:
    from testbed.link.pipeline import Stub


class _State:
    __slots__ = ("transmitted",)

    def __init__(self) -> None:
        self.transmitted = 0


class LimitDataToxic(Toxic):
    type_name: ClassVar[str] = "limit_data"
    attrs: ClassVar[tuple[Attr, ...]] = (
        Attr("bytes", "int", 0, "bytes to let through before closing", minimum=0),
    )

    def new_state(self) -> Any:
        return _State()

    async def pipe(self, stub: Stub) -> None:
        limit = self.values["bytes"]
        state: _State = stub.state
        while True:
            item = await stub.recv()
            if isinstance(item, End):
                await stub.send(item)
                return
            remaining = max(0, limit - state.transmitted)
            data = item.data
            if remaining < len(data):
                item = Chunk(data[:remaining], item.ts)
            if len(item.data) > 0:
                await stub.send(item)
                state.transmitted += len(item.data)
            if limit - state.transmitted <= 0:
                await stub.send(CLOSE)
                return
