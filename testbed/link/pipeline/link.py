"""One direction of one proxied connection (ToxicLink): where the source socket's reads go, the
chain of stages, and how the sink's flow control reaches back to the source."""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import Protocol

from testbed.link.pipeline.chunks import CLOSE, EOF, Chunk, Item
from testbed.link.pipeline.sink import LinkStats, Sink, SinkClosed
from testbed.link.pipeline.splice import SPLICE_MIN, Splicer, available
from testbed.link.pipeline.stage import Stage, StageWrapper

__all__ = ["SPLICE", "ConnectionControl", "ToxicLink"]

SPLICE = available()
"""Whether no-toxic directions hand bulk transfers to a Splicer (splice.py); tests turn it off
to compare."""


class ConnectionControl(Protocol):
    """What a direction may ask of the connection it belongs to."""

    def close(self) -> None: ...

    def reset(self) -> None: ...

    def direction_done(self, link: ToxicLink) -> None: ...


class ToxicLink:
    """One direction (upstream: client->server, downstream: server->client) of a connection."""

    __slots__ = (
        "_reading_paused",
        "cancelled",
        "conn",
        "direction",
        "done",
        "loop",
        "seed_base",
        "sink",
        "source",
        "splice_ok",
        "splicer",
        "stages",
        "stats",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        direction: str,
        conn: ConnectionControl,
        source: asyncio.ReadTransport,
        sink: Sink,
        stats: LinkStats,
        seed_base: str | None = None,
    ) -> None:
        self.loop = loop
        self.seed_base = seed_base
        self.direction = direction
        self.conn = conn
        self.source = source
        self.sink = sink
        self.stats = stats
        self.stages: list[Stage] = []
        self.done = False
        self.cancelled = False
        self._reading_paused = False
        self.splice_ok = SPLICE
        self.splicer: Splicer | None = None

    # -- chain changes -------------------------------------------------------------------
    def rng_for(self, toxic_name: str) -> random.Random:
        """This stage's random source: reproducible per (seed, proxy, connection, toxic)."""
        if self.seed_base is None:
            return random.Random()
        return random.Random(f"{self.seed_base}/{self.direction}/{toxic_name}")

    def add_toxic(self, wrapper: StageWrapper) -> Stage:
        if self.splicer is not None:  # the thread hands back before the stage reads a byte
            self.splicer.stop()
        stage = Stage(self, wrapper, self.rng_for(wrapper.name))
        self.stages.append(stage)
        stage.start()
        return stage

    def find(self, wrapper: StageWrapper) -> Stage | None:
        for st in self.stages:
            if not st.removed and st.wrapper is wrapper:
                return st
        return None

    def next_after(self, stage: Stage) -> Stage | None:
        stages = self.stages
        i = stages.index(stage) + 1
        return stages[i] if i < len(stages) else None

    def unlink(self, stage: Stage) -> None:
        if stage in self.stages:
            self.stages.remove(stage)
        self.maybe_resume()

    def cancel(self) -> None:
        self.cancelled = True
        if self.splicer is not None:
            self.splicer.stop(abort=True)
        for st in self.stages:
            if st.task is not None:
                st.task.cancel()

    # -- reading side --------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        """Data read from the source socket (called from the protocol, synchronously)."""
        self.stats.received += len(data)
        if not self.stages:
            sink = self.sink
            sink.write(data)
            if sink.paused:
                self._pause_reading()
            elif len(data) >= SPLICE_MIN and self.splice_ok:
                self._start_splice()
            return
        q = self.stages[0].queue
        q.put_nowait(Chunk(data, self.loop.time()))
        if q.full():
            self._pause_reading()

    def feed_eof(self) -> None:
        if not self.stages:
            self.done = True
            self.conn.direction_done(self)
        else:
            self.stages[0].queue.put_nowait(EOF)

    def _pause_reading(self) -> None:
        if not self._reading_paused:
            self._reading_paused = True
            with contextlib.suppress(RuntimeError, AttributeError):
                self.source.pause_reading()

    def maybe_resume_after_setup(self) -> None:
        """The source socket starts paused (before the upstream was connected): start it."""
        if not self._reading_paused:
            self._reading_paused = True
            self.maybe_resume()

    def maybe_resume(self) -> None:
        """Resume reading when whatever the source feeds has room again."""
        if not self._reading_paused or self.splicer is not None or self.cancelled:
            return
        if self.stages:
            if self.stages[0].queue.full():
                return
        elif self.sink.paused:
            return
        self._reading_paused = False
        with contextlib.suppress(RuntimeError, AttributeError):
            self.source.resume_reading()

    # -- the kernel path (splice.py) ------------------------------------------------------
    def _start_splice(self) -> None:
        """Hand this direction's reads to a Splicer, if nothing is waiting in the sink."""
        sink_t = self.sink.transport
        if self.splicer is not None or self.cancelled or sink_t.get_write_buffer_size():
            return
        src = self.source.get_extra_info("socket")
        dst = sink_t.get_extra_info("socket")
        if src is None or dst is None:
            self.splice_ok = False
            return
        self._pause_reading()
        self.splicer = Splicer(self.loop, src, dst, self._spliced, self._splice_ended)
        self.splicer.start()

    def _spliced(self, received: int, sent: int) -> None:
        self.stats.received += received
        self.sink.stats.sent += sent

    def _splice_ended(self, reason: str) -> None:
        self.splicer = None
        if self.cancelled:
            return
        if reason == "error":
            self.conn.close()
        elif reason == "eof":
            self.feed_eof()
        else:  # stopped for a toxic: its stage reads from the source from now on
            self.maybe_resume()

    # -- writing side --------------------------------------------------------------------
    def sink_paused(self) -> None:
        self.sink.pause()
        if not self.stages:
            self._pause_reading()

    def sink_resumed(self) -> None:
        self.sink.resume()
        self.maybe_resume()

    async def deliver(self, item: Item) -> None:
        """Write one item to the sink (the end of the chain)."""
        sink = self.sink
        if sink.closed:
            raise SinkClosed
        if isinstance(item, Chunk):
            sink.write(item.data)
            if sink.paused:
                await sink.drain()
            return
        if item is CLOSE:
            self.conn.close()
            raise SinkClosed
        self.done = True
        self.conn.direction_done(self)
