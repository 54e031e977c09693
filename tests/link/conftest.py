"""Fixtures for the link emulator tests: an in-process emulator, upstream servers on 127.0.0.1
(port 0), traffic helpers that count bytes, and an emulator on a background thread for the
synchronous toxiproxy-python client. Everything is torn down even when a test fails."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

import pytest

from testbed.link.client import LinkClient
from testbed.link.server import LinkServer, start_link_server


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Run the async tests here on uvloop, the loop `testbed link serve` uses."""
    import uvloop

    return {"uvloop": uvloop.new_event_loop}


@pytest.fixture
async def link() -> AsyncIterator[LinkServer]:
    server = await start_link_server("127.0.0.1", 0, seed=1234)
    try:
        yield server
    finally:
        await server.close()


@pytest.fixture
async def client(link: LinkServer) -> AsyncIterator[LinkClient]:
    async with LinkClient(link.url, timeout=5) as c:
        yield c


@pytest.fixture
async def echo() -> AsyncIterator[tuple[str, int]]:
    """An echo server: writes back what it reads, half-closes when the peer does."""

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
            w.write_eof()
        except (ConnectionError, OSError):
            pass
        finally:
            w.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield srv.sockets[0].getsockname()[:2]
    finally:
        srv.close()


@dataclass
class Sink:
    """Counts bytes from every connection, with (time, total) samples for rate checks."""

    total: int = 0
    per_conn: list[int] = field(default_factory=list)
    chunks: list[tuple[float, int]] = field(default_factory=list)
    eofs: int = 0
    addr: tuple[str, int] = ("127.0.0.1", 0)

    def rate_between(self, t0: float, t1: float) -> float:
        """Bytes/s received in [t0, t1) (loop time)."""
        got = sum(n for t, n in self.chunks if t0 <= t < t1)
        return got / (t1 - t0)


class _SinkProtocol(asyncio.Protocol):
    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.index = len(sink.per_conn)
        sink.per_conn.append(0)
        self.loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        n = len(data)
        self.sink.total += n
        self.sink.per_conn[self.index] += n
        self.sink.chunks.append((self.loop.time(), n))

    def eof_received(self) -> bool:
        self.sink.eofs += 1
        return False


@pytest.fixture
async def sink() -> AsyncIterator[Sink]:
    loop = asyncio.get_running_loop()
    s = Sink()
    srv = await loop.create_server(lambda: _SinkProtocol(s), "127.0.0.1", 0)
    s.addr = srv.sockets[0].getsockname()[:2]
    try:
        yield s
    finally:
        srv.close()


async def blast(addr: tuple[str, int], seconds: float, chunk: int = 256 * 1024) -> int:
    """Send as fast as the path allows for `seconds`; returns bytes written."""
    loop = asyncio.get_running_loop()
    _r, w = await asyncio.wait_for(asyncio.open_connection(*addr), 5)
    buf = b"\0" * chunk
    sent = 0
    end = loop.time() + seconds
    try:
        while loop.time() < end:
            w.write(buf)
            sent += chunk
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(w.drain(), max(0.01, end - loop.time()))
    finally:
        w.transport.abort()
    return sent


@pytest.fixture
def blaster() -> Callable[..., object]:
    return blast


def listen_addr(proxy_json: dict[str, object]) -> tuple[str, int]:
    host, port = str(proxy_json["listen"]).rsplit(":", 1)
    return host, int(port)


@pytest.fixture
def addr_of() -> Callable[[dict[str, object]], tuple[str, int]]:
    return listen_addr


@dataclass
class ThreadedEmulator:
    host: str
    port: int
    upstream: tuple[str, int]


@pytest.fixture
def threaded_emulator() -> Iterator[ThreadedEmulator]:
    """The emulator plus an echo upstream on their own event loop thread (for sync clients)."""
    import uvloop

    loop = uvloop.new_event_loop()
    ready: dict[str, object] = {}
    started = threading.Event()
    stop: asyncio.Event | None = None

    async def main() -> None:
        nonlocal stop
        stop = asyncio.Event()

        async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            w.close()

        up = await asyncio.start_server(handle, "127.0.0.1", 0)
        server = await start_link_server("127.0.0.1", 0, seed=1)
        ready["port"] = server.port
        ready["upstream"] = up.sockets[0].getsockname()[:2]
        started.set()
        try:
            await stop.wait()
        finally:
            await server.close()
            up.close()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert started.wait(10), "emulator thread did not start"
    try:
        yield ThreadedEmulator("127.0.0.1", int(ready["port"]), ready["upstream"])  # type: ignore[arg-type]
    finally:
        assert stop is not None
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        deadline = time.monotonic() + 5
        while loop.is_running() and time.monotonic() < deadline:
            time.sleep(0.01)
        loop.close()
