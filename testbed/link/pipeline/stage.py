"""One toxic running on one direction of one connection (a Stage), and the handle the toxic
gets on it (a Stub, Toxiproxy's ToxicStub).

A stage runs its toxic as an asyncio task that reads from the stage's queue and forwards to
whatever follows it *now* (the next stage or the sink), re-resolved after every wait, so stages
can be added and removed under a live connection without reordering or losing a byte.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any, ClassVar, Protocol

from testbed.link.pipeline.chunks import ChunkQueue, End, Item
from testbed.link.pipeline.sink import SinkClosed

__all__ = [
    "Interrupted",
    "Stage",
    "StageConnection",
    "StageLink",
    "StageToxic",
    "StageWrapper",
    "Stub",
]

_log = logging.getLogger(__name__)


class Interrupted(Exception):
    """Raised by Stub.recv when the running toxic must stop (toxic updated or removed)."""


class StageConnection(Protocol):
    """What a toxic may do to the whole connection (see ConnectionControl)."""

    def close(self) -> None: ...

    def reset(self) -> None: ...


class StageLink(Protocol):
    """What a stage needs from the direction it runs on (a ToxicLink). A protocol, so the
    direction imports its stages and not the other way round."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    @property
    def direction(self) -> str: ...

    @property
    def conn(self) -> StageConnection: ...

    def maybe_resume(self) -> None: ...

    def next_after(self, stage: Stage) -> Stage | None: ...

    async def deliver(self, item: Item) -> None: ...

    def unlink(self, stage: Stage) -> None: ...


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

    def __init__(self, link: StageLink, wrapper: StageWrapper, rng: random.Random) -> None:
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
