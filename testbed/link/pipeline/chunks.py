"""What flows through a direction (chunks of bytes, and the End that closes it) and the bounded
queue in front of each stage.

Queues are bounded in bytes, not items: a stage holding back data (latency, bandwidth) must push
back on the sender through TCP's own flow control rather than buffer without limit.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

__all__ = ["CLOSE", "EOF", "QUEUE_HIGH", "QUEUE_LOW", "Chunk", "ChunkQueue", "End", "Item"]

# Bytes a stage's input queue holds before the producer is held back (and the socket paused).
QUEUE_HIGH = 8 * 1024 * 1024
QUEUE_LOW = QUEUE_HIGH // 2


class Chunk:
    """Bytes read from the source and the loop time they were read (or released by a stage)."""

    __slots__ = ("data", "ts")

    def __init__(self, data: bytes | memoryview, ts: float) -> None:
        self.data = data
        self.ts = ts


class End:
    """End of a direction: EOF half-closes the sink, CLOSE closes the whole connection."""

    __slots__ = ("kind",)

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __repr__(self) -> str:
        return f"End({self.kind})"


EOF = End("eof")
CLOSE = End("close")
Item = Chunk | End


class ChunkQueue:
    """FIFO of items with a byte count; one consumer, producers wait for space."""

    __slots__ = ("_getter", "_items", "_space", "nbytes", "on_drain")

    def __init__(self) -> None:
        self._items: deque[Item] = deque()
        self._getter: asyncio.Future[None] | None = None
        self._space: deque[asyncio.Future[None]] = deque()
        self.nbytes = 0
        self.on_drain: Callable[[], None] | None = None

    def __len__(self) -> int:
        return len(self._items)

    def full(self) -> bool:
        return self.nbytes >= QUEUE_HIGH

    def put_nowait(self, item: Item) -> None:
        self._items.append(item)
        if isinstance(item, Chunk):
            self.nbytes += len(item.data)
        g = self._getter
        if g is not None and not g.done():
            g.set_result(None)

    async def wait_space(self) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._space.append(fut)
        try:
            await fut
        finally:
            if fut in self._space:
                self._space.remove(fut)

    def pop(self) -> Item:
        item = self._items.popleft()
        if isinstance(item, Chunk):
            self.nbytes -= len(item.data)
            if self.nbytes < QUEUE_LOW:
                while self._space:
                    f = self._space.popleft()
                    if not f.done():
                        f.set_result(None)
                if self.on_drain is not None:
                    self.on_drain()
        return item

    async def wait_item(self) -> None:
        """Wait until an item is queued or `wake` is called."""
        if self._items:
            return
        fut = asyncio.get_running_loop().create_future()
        self._getter = fut
        try:
            await fut
        finally:
            self._getter = None

    def wake(self) -> None:
        """Wake a waiting consumer so it can notice an interrupt."""
        g = self._getter
        if g is not None and not g.done():
            g.set_result(None)
