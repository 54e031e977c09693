"""The link API under slow and vanishing clients (item 9): at most one log line per request
whose client went away mid-body, slow heads are cut off, and connections are capped."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from testbed.link.client import LinkClient
from testbed.link.server import LinkServer, start_link_server
from testbed.serving import ServingLimits

pytestmark = pytest.mark.timeout(120)


async def _open(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)


async def _wait_for_idle(link: LinkServer) -> None:
    for _ in range(1000):
        if link.http.connections == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{link.http.connections} connections still open")


@pytest.fixture
async def limited() -> AsyncIterator[LinkServer]:
    limits = ServingLimits(max_connections=8, header_timeout=2.0, body_timeout=2.0)
    server = await start_link_server("127.0.0.1", 0, limits=limits)
    try:
        yield server
    finally:
        await server.close()


async def test_half_sent_bodies_log_at_most_one_line_each(
    link: LinkServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    n = 300
    routes = [b"POST /proxies", b"POST /populate", b"POST /proxies/p/toxics", b"POST /reset"]
    for i in range(n):
        _r, w = await _open(link.port)
        route = routes[i % len(routes)]
        w.write(route + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b'{"name": "')
        await w.drain()
        await asyncio.sleep(0)
        w.transport.abort()
    await _wait_for_idle(link)
    records = [r for r in caplog.records if r.name.startswith(("aiohttp", "testbed"))]
    assert not [r for r in records if r.exc_info], [r.getMessage() for r in records[:3]]
    assert len(records) <= n, [r.getMessage() for r in records[:5]]
    async with LinkClient(link.url) as c:
        assert (await c.version()).startswith("2.")
        assert await c.proxies() == {}  # no half-sent create got through


async def test_slow_head_is_cut_off(limited: LinkServer) -> None:
    head = b"GET /proxies HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"a" * 64 + b"\r\n\r\n"
    r, w = await _open(limited.port)
    closed = False
    try:
        for byte in head[:8]:  # 1 byte a second against a 2 s deadline
            w.write(bytes([byte]))
            try:
                data = await asyncio.wait_for(r.read(65536), 1.0)
            except TimeoutError:
                continue
            except ConnectionError:
                data = b""
            assert not data.startswith(b"HTTP/1.1 200"), data
            closed = True
            break
    finally:
        w.transport.abort()
    assert closed


async def test_connection_cap_keeps_the_open_ones_working(limited: LinkServer) -> None:
    clients = [LinkClient(limited.url) for _ in range(8)]
    try:
        # Each client holds one keep-alive connection after its first call.
        for c in clients:
            assert (await c.version()).startswith("2.")
        assert limited.http.connections == 8
        r, w = await _open(limited.port)
        w.write(b"GET /version HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        try:
            data = await asyncio.wait_for(r.read(65536), 10)
        except ConnectionError:
            data = b""
        assert not data.startswith(b"HTTP/1.1 200"), data
        w.transport.abort()
        assert limited.http.refused >= 1
        for c in clients:
            assert (await c.version()).startswith("2.")
    finally:
        for c in clients:
            await c.close()
