"""A one-shot corrupting TCP proxy on 127.0.0.1: flips one byte of the first connection.

The link emulator's toxics delay, cap, cut and reset, but never corrupt bytes (TCP would not let
real corruption through silently either, yet a buggy NIC, proxy or memory can). To show that a
corrupt KV frame is caught by the receiver's checksum and never decoded, this proxy XORs the byte
at stream offset `flip_at` of the first connection's sender -> receiver direction with 0xFF,
and forwards everything else untouched. Torch-free and independent of the model.
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["FlipProxy"]

_IO_TIMEOUT = 30.0


class FlipProxy:
    """Forward 127.0.0.1:<port> to 127.0.0.1:<upstream_port>; use `async with`."""

    def __init__(self, upstream_port: int, flip_at: int) -> None:
        if flip_at < 0:
            raise ValueError("flip_at must be >= 0")
        self.upstream_port = upstream_port
        self.flip_at = flip_at
        self.flips = 0
        self._accepted = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("proxy is not running")
        return int(self._server.sockets[0].getsockname()[1])

    async def __aenter__(self) -> FlipProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.transport.abort()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = self._accepted == 0
        self._accepted += 1
        task = asyncio.get_running_loop().create_task(self._handle(reader, writer, first))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handle(
        self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter, corrupt: bool
    ) -> None:
        self._writers.add(cw)
        try:
            async with asyncio.timeout(_IO_TIMEOUT):
                ur, uw = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except (OSError, TimeoutError):
            self._writers.discard(cw)
            cw.transport.abort()
            return
        self._writers.add(uw)
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._pump(cr, uw, corrupt))
                tg.create_task(self._pump(ur, cw, False))
        except* (OSError, TimeoutError, EOFError):
            pass
        finally:
            for w in (cw, uw):
                self._writers.discard(w)
                w.transport.abort()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, corrupt: bool
    ) -> None:
        passed = 0
        while True:
            async with asyncio.timeout(_IO_TIMEOUT):
                data = await reader.read(1 << 16)
            if not data:
                raise EOFError  # one side closed: tear the pair down
            pos = self.flip_at - passed
            if corrupt and 0 <= pos < len(data):
                buf = bytearray(data)
                buf[pos] ^= 0xFF
                data = bytes(buf)
                self.flips += 1
            passed += len(data)
            writer.write(data)
            with contextlib.suppress(ConnectionResetError):
                async with asyncio.timeout(_IO_TIMEOUT):
                    await writer.drain()
