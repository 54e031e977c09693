"""The end of a direction's chain: the destination socket, written with its flow control."""

from __future__ import annotations

import asyncio

__all__ = ["LinkStats", "Sink", "SinkClosed"]


class SinkClosed(Exception):
    """The sink's socket is gone; the stage has nothing left to do."""


class LinkStats:
    """Byte counters of one proxy direction, shared by all its connections (for /metrics)."""

    __slots__ = ("received", "sent")

    def __init__(self) -> None:
        self.received = 0
        self.sent = 0


class Sink:
    """Writes a direction's output to its destination transport, honouring its flow control."""

    __slots__ = ("_drain", "closed", "paused", "stats", "transport")

    def __init__(self, transport: asyncio.WriteTransport, stats: LinkStats) -> None:
        self.transport = transport
        self.stats = stats
        self.paused = False
        self.closed = False
        self._drain: asyncio.Future[None] | None = None

    def write(self, data: bytes | memoryview) -> None:
        self.transport.write(data)
        self.stats.sent += len(data)

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        d = self._drain
        if d is not None and not d.done():
            d.set_result(None)

    def lost(self) -> None:
        self.closed = True
        self.resume()

    async def drain(self) -> None:
        while self.paused and not self.closed:
            self._drain = asyncio.get_running_loop().create_future()
            try:
                await self._drain
            finally:
                self._drain = None
        if self.closed:
            raise SinkClosed
