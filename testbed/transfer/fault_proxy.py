"""A fault-injecting TCP proxy on 127.0.0.1 that places faults at exact byte offsets.

The link emulator's toxics delay, cap, cut and reset, but never corrupt bytes, and never at a
chosen byte; the transfer tests and `testbed verify-model` need both (flip byte N of a KV stream
to show the checksum catches it, reset after N bytes to show a retry completes exactly once),
deterministically. Torch-free.
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["FaultProxy"]


class _Reset(Exception):
    pass


class FaultProxy:
    """Forward 127.0.0.1:<port> to an upstream port, injecting faults on chosen connections.

    Connections are numbered in accept order. On the sender->receiver direction of connection
    `target` (default 0) the proxy can flip one byte at stream offset `flip_at`, or reset both
    sides (RST) once `reset_after` bytes went through; `resets` says how many connections,
    starting at `target`, get the reset.
    """

    def __init__(
        self,
        upstream_port: int,
        *,
        flip_at: int | None = None,
        reset_after: int | None = None,
        resets: int = 1,
        target: int = 0,
    ) -> None:
        if flip_at is not None and flip_at < 0:
            raise ValueError("flip_at must be >= 0")
        self.upstream_port = upstream_port
        self.flip_at = flip_at
        self.reset_after = reset_after
        self.resets = resets
        self.target = target
        self.accepted = 0
        self.resets_done = 0
        self.flips_done = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)

    async def __aenter__(self) -> FaultProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        assert self._server is not None
        self._server.close()
        for w in list(self._writers):
            w.transport.abort()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def _accept(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        index = self.accepted
        self.accepted += 1
        task = asyncio.get_running_loop().create_task(self._handle(index, cr, cw))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handle(self, index: int, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        self._writers.add(cw)
        try:
            async with asyncio.timeout(5):
                ur, uw = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except (OSError, TimeoutError):
            cw.transport.abort()
            return
        self._writers.add(uw)
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._pump(ur, cw, index, forward=False, both=(cw, uw)))
                tg.create_task(self._pump(cr, uw, index, forward=True, both=(cw, uw)))
        except* (_Reset, OSError, TimeoutError):
            pass
        finally:
            for w in (cw, uw):
                self._writers.discard(w)
                w.transport.abort()

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        index: int,
        *,
        forward: bool,
        both: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        passed = 0
        resetting = (
            forward
            and self.reset_after is not None
            and self.target <= index < self.target + self.resets
        )
        while True:
            async with asyncio.timeout(30):
                data = await reader.read(1 << 16)
            if not data:
                raise _Reset("eof")
            if forward and index == self.target and self.flip_at is not None:
                pos = self.flip_at - passed
                if 0 <= pos < len(data):
                    buf = bytearray(data)
                    buf[pos] ^= 0xFF
                    data = bytes(buf)
                    self.flips_done += 1
            if (
                resetting
                and self.reset_after is not None
                and passed + len(data) >= self.reset_after
            ):
                writer.write(data[: self.reset_after - passed])
                with contextlib.suppress(OSError):
                    await writer.drain()
                self.resets_done += 1
                for w in both:
                    w.transport.abort()
                raise _Reset("injected reset")
            writer.write(data)
            async with asyncio.timeout(30):
                await writer.drain()
            passed += len(data)
