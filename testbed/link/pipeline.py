"""One direction of one proxied connection: source socket -> chain of toxic stages -> sink socket.

This mirrors Toxiproxy's ToxicLink. Each toxic on the direction runs as a stage (an asyncio task)
that reads chunks from its input queue and passes them to whatever follows it now, the next stage
or the sink. Chunks are stamped with the time they were read, so a latency toxic holds each chunk
until read time + delay and pipelines instead of capping throughput. Queues are bounded in bytes;
when the first one fills the source socket stops being read, which pushes back on the sender
through TCP's own flow control.

With no stages the direction takes the fast path: each socket read is written straight to the
sink transport, and reading pauses while the sink's write buffer is full. No queue, task or
timestamp is involved, which is what keeps an unshaped link close to raw loopback speed.

Toxics come and go while connections are open. A new stage is appended at the end (as Toxiproxy
does). A removed stage is interrupted: whatever it holds is passed on at once, its queue is
drained in order, and only when it is empty does the stage unlink itself, so no byte is reordered
or lost. An updated toxic is swapped in place; stages are interrupted and restarted (re-drawing
toxicity) unless the toxic applies updates live.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

__all__ = [
    "CLOSE",
    "EOF",
    "Chunk",
    "ChunkQueue",
    "ConnectionControl",
    "End",
    "Interrupted",
    "Item",
    "LinkStats",
    "Sink",
    "Stage",
    "Stub",
    "ToxicLink",
]

_log = logging.getLogger(__name__)

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


class Interrupted(Exception):
    """Raised by Stub.recv when the running toxic must stop (toxic updated or removed)."""


class SinkClosed(Exception):
    """The sink's socket is gone; the stage has nothing left to do."""


class LinkStats:
    """Byte counters of one proxy direction, shared by all its connections (for /metrics)."""

    __slots__ = ("received", "sent")

    def __init__(self) -> None:
        self.received = 0
        self.sent = 0


class ConnectionControl(Protocol):
    """What a direction may ask of the connection it belongs to."""

    def close(self) -> None: ...

    def reset(self) -> None: ...

    def direction_done(self, link: ToxicLink) -> None: ...


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


class StageToxic(Protocol):
    """What a stage runs: a testbed.link.toxics.base.Toxic. A protocol here, because the toxics
    import the pipeline (Stub, Chunk, End) and the pipeline must not import them back."""

    closes_on_removal: ClassVar[bool]

    def new_state(self) -> Any: ...

    async def pipe(self, stub: Stub) -> None: ...


class StageWrapper(Protocol):
    """A toxic as configured (testbed.link.toxics.base.ToxicWrapper): what a stage reads."""

    @property
    def name(self) -> str: ...

    @property
    def toxicity(self) -> float: ...

    @property
    def toxic(self) -> StageToxic: ...


class Stub:
    """A toxic's handle on its stage: receive, send, sleep, and end the connection.

    Mirrors Toxiproxy's ToxicStub. `state` is per-connection toxic state that survives updates;
    `rng` is this stage's random source (seeded when the server has a seed).
    """

    __slots__ = ("_stage", "direction", "loop", "rng", "state")

    def __init__(self, stage: Stage) -> None:
        self._stage = stage
        self.loop = stage.link.loop
        self.direction = stage.link.direction
        self.rng = stage.rng
        self.state: Any = None

    @property
    def wrapper(self) -> StageWrapper:
        """The toxic as configured now (live-update toxics read their attributes from here)."""
        return self._stage.wrapper

    @property
    def interrupted(self) -> bool:
        return self._stage.interrupted

    async def recv(self) -> Item:
        """Next chunk or End; raises Interrupted once the toxic must stop (nothing is held)."""
        st = self._stage
        q = st.queue
        while True:
            if st.interrupted:
                raise Interrupted
            if len(q):
                return q.pop()
            await q.wait_item()

    async def send(self, item: Item) -> None:
        await self._stage.forward(item)

    async def sleep_until(self, when: float) -> None:
        """Sleep until loop time `when`; returns early if interrupted (then just pass data on)."""
        st = self._stage
        if when <= self.loop.time() or st.interrupted:
            return
        fut = self.loop.create_future()
        handle = self.loop.call_at(when, _wake, fut)
        st.sleeper = fut
        try:
            await fut
        finally:
            handle.cancel()
            st.sleeper = None

    def reset_connection(self) -> None:
        """Abort both sockets with RST (Toxiproxy's reset_peer)."""
        self._stage.link.conn.reset()


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Stage:
    """One toxic running on one direction of one connection."""

    __slots__ = (
        "interrupted",
        "link",
        "queue",
        "removed",
        "rng",
        "sleeper",
        "stub",
        "task",
        "wrapper",
    )

    def __init__(self, link: ToxicLink, wrapper: StageWrapper, rng: random.Random) -> None:
        self.link = link
        self.wrapper = wrapper
        self.rng = rng
        self.queue = ChunkQueue()
        self.queue.on_drain = link.maybe_resume
        self.removed = False
        self.sleeper: asyncio.Future[None] | None = None
        self.interrupted = False
        self.stub = Stub(self)
        self.stub.state = wrapper.toxic.new_state()
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = self.link.loop.create_task(self._run())

    def interrupt(self) -> None:
        self.interrupted = True
        self.queue.wake()
        if self.sleeper is not None and not self.sleeper.done():
            self.sleeper.set_result(None)

    def update(self, wrapper: StageWrapper, restart: bool) -> None:
        self.wrapper = wrapper
        if restart:
            self.interrupt()

    def remove(self) -> None:
        self.removed = True
        self.interrupt()

    async def forward(self, item: Item) -> None:
        """Pass an item to whatever follows this stage now (re-resolved after every wait)."""
        link = self.link
        while True:
            nxt = link.next_after(self)
            if nxt is None:
                await link.deliver(item)
                return
            if nxt.queue.full():
                await nxt.queue.wait_space()
                continue
            nxt.queue.put_nowait(item)
            return

    async def _run(self) -> None:
        try:
            while True:
                wrapper = self.wrapper
                toxic = wrapper.toxic
                active = self.rng.random() < wrapper.toxicity
                try:
                    if active:
                        await toxic.pipe(self.stub)
                    else:
                        await _noop_pipe(self.stub)
                    return  # the direction ended (End passed on) or the connection closed
                except Interrupted:
                    if self.removed:
                        if active and toxic.closes_on_removal:
                            self.link.conn.close()
                            return
                        await self._drain_and_unlink()
                        return
                    self.interrupted = False
        except SinkClosed:
            return
        except Exception:
            _log.exception("toxic %r failed; closing the connection", self.wrapper.name)
            self.link.conn.close()

    async def _drain_and_unlink(self) -> None:
        while len(self.queue):
            item = self.queue.pop()
            await self.forward(item)
            if isinstance(item, End):
                return
        self.link.unlink(self)


async def _noop_pipe(stub: Stub) -> None:
    while True:
        item = await stub.recv()
        await stub.send(item)
        if isinstance(item, End):
            return


class ToxicLink:
    """One direction (upstream: client->server, downstream: server->client) of a connection."""

    __slots__ = (
        "_reading_paused",
        "conn",
        "direction",
        "done",
        "loop",
        "seed_base",
        "sink",
        "source",
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
        self._reading_paused = False

    # -- chain changes -------------------------------------------------------------------
    def rng_for(self, toxic_name: str) -> random.Random:
        """This stage's random source: reproducible per (seed, proxy, connection, toxic)."""
        if self.seed_base is None:
            return random.Random()
        return random.Random(f"{self.seed_base}/{self.direction}/{toxic_name}")

    def add_toxic(self, wrapper: StageWrapper) -> Stage:
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
        if not self._reading_paused:
            return
        if self.stages:
            if self.stages[0].queue.full():
                return
        elif self.sink.paused:
            return
        self._reading_paused = False
        with contextlib.suppress(RuntimeError, AttributeError):
            self.source.resume_reading()

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
