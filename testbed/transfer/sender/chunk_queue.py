"""The one queue of frames all of a sender's connections take from."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence

from testbed.transfer.sender.outbound import Chunk, Kind, Outbound

__all__ = ["ChunkQueue"]


class ChunkQueue:
    """FIFO of chunks shared by all writers, with push-to-front for retransmissions.

    One shared queue is the striping: whichever connection drains first takes the next chunk, so
    load follows each connection's real speed without a scheduler.
    """

    def __init__(self) -> None:
        self._items: deque[Chunk] = deque()
        self._nonempty = asyncio.Event()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, chunk: Chunk) -> None:
        self._items.append(chunk)
        self._nonempty.set()

    def put_front(self, chunks: Sequence[Chunk]) -> None:
        self._items.extendleft(reversed(chunks))
        if chunks:
            self._nonempty.set()

    async def get(self) -> Chunk:
        while not self._items:
            self._nonempty.clear()
            await self._nonempty.wait()
        return self._items.popleft()

    def purge(self, req: Outbound) -> list[Chunk]:
        """Remove and return every queued DATA/END chunk of `req`."""
        kept: deque[Chunk] = deque()
        removed: list[Chunk] = []
        for c in self._items:
            (removed if c.req is req and c.kind is not Kind.ABORT else kept).append(c)
        self._items = kept
        return removed
