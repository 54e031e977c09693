"""testbed.serving (item 9): the project's aiohttp servers cut off clients that send a request's
head or body too slowly, refuse connections beyond a cap while the open ones keep working, and
log at most one line for a request whose client went away mid-body, and (issue 33, defect 7)
one line for a malformed request while a handler's bug keeps its traceback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from testbed.services import host
from testbed.services.spec import ServiceSpec
from testbed.serving import HttpServer, ServingLimits, start_http

pytestmark = pytest.mark.timeout(120)

HEAD = (
    b"GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slowloris\r\n"
    b"X-Padding: " + b"a" * 100 + b"\r\n\r\n"
)


def _app(done: list[str]) -> web.Application:
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hi")

    async def upload(request: web.Request) -> web.Response:
        body = await request.read()
        done.append("upload")
        return web.Response(text=str(len(body)))

    async def bug(request: web.Request) -> web.Response:
        raise RuntimeError("a bug in a handler")

    app = web.Application()
    app.router.add_get("/hello", hello)
    app.router.add_post("/upload", upload)
    app.router.add_get("/bug", bug)
    return app


@pytest.fixture
async def served() -> AsyncIterator[tuple[HttpServer, list[str]]]:
    done: list[str] = []
    limits = ServingLimits(max_connections=4, header_timeout=2.0, body_timeout=2.0)
    server = await start_http(_app(done), host="127.0.0.1", port=0, limits=limits)
    try:
        yield server, done
    finally:
        await server.close()


async def _open(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)


async def _get(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> int:
    """One keep-alive GET /hello on an open connection; returns the status."""
    w.write(b"GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 10)
    status = int(head.split()[1])
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    await asyncio.wait_for(r.readexactly(length), 10)
    return status


async def _closed_within(r: asyncio.StreamReader, seconds: float) -> bool:
    """True if the server closed the connection (EOF or reset) within `seconds`."""
    try:
        data = await asyncio.wait_for(r.read(65536), seconds)
    except TimeoutError:
        return False
    except ConnectionError:
        return True
    assert not data.startswith(b"HTTP/1.1 200"), data  # it must not have been served
    return True


async def _trickle(port: int, prefix: bytes, trickle: bytes, limit: int) -> tuple[bool, int]:
    """Send `prefix`, then `trickle` one byte a second (at most `limit` bytes).

    Returns (closed by the server, bytes of `trickle` sent)."""
    r, w = await _open(port)
    w.write(prefix)
    sent = 0
    try:
        for byte in trickle[:limit]:
            w.write(bytes([byte]))
            sent += 1
            if await _closed_within(r, 1.0):
                return True, sent
        return False, sent
    except ConnectionError:
        return True, sent
    finally:
        w.transport.abort()


async def test_slow_header_is_cut_off(served: tuple[HttpServer, list[str]]) -> None:
    server, _ = served
    # 1 byte a second against a 2 s header deadline; give up (fail) after 8 bytes.
    closed, sent = await _trickle(server.port, b"", HEAD, 8)
    assert closed and sent < len(HEAD)
    assert server.cut == 1


async def test_slow_body_is_cut_off(
    served: tuple[HttpServer, list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    server, done = served
    caplog.set_level(logging.DEBUG)
    head = b"POST /upload HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n"
    closed, sent = await _trickle(server.port, head, b"x" * 100, 8)
    assert closed and sent < 100
    assert server.cut == 1
    assert done == []  # the handler never got the body
    await _wait_idle(server)
    _assert_quiet(caplog, 1)


async def test_connections_beyond_the_cap_are_refused(
    served: tuple[HttpServer, list[str]],
) -> None:
    server, _ = served
    conns = [await _open(server.port) for _ in range(4)]
    for r, w in conns:
        assert await _get(r, w) == 200
    r5, w5 = await _open(server.port)  # the kernel accepts it; the server closes it
    w5.write(b"GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert await _closed_within(r5, 10)
    w5.transport.abort()
    assert server.refused >= 1
    for r, w in conns:  # the open ones keep working
        assert await _get(r, w) == 200
    conns[0][1].transport.abort()
    await _wait_for(lambda: server.connections == 3)
    r6, w6 = await _open(server.port)  # a freed slot is usable again
    assert await _get(r6, w6) == 200
    for _, w in [*conns[1:], (r6, w6)]:
        w.transport.abort()


async def test_aborted_bodies_log_at_most_one_line_each(
    served: tuple[HttpServer, list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    server, done = served
    caplog.set_level(logging.DEBUG)
    n = 300
    for _ in range(n):
        r, w = await _open(server.port)
        w.write(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"y" * 10)
        await w.drain()
        await asyncio.sleep(0)
        w.transport.abort()
        await _wait_for(lambda: server.connections < 4)
    await _wait_idle(server)
    assert done == []
    _assert_quiet(caplog, n)
    r, w = await _open(server.port)
    assert await _get(r, w) == 200
    w.transport.abort()


async def test_host_serve_applies_the_limits(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """host.serve (every service process) builds its server through testbed.serving."""

    async def factory(spec: ServiceSpec) -> tuple[web.Application, dict[str, int]]:
        return _app([]), {}

    spec = ServiceSpec(role="decode", id="t", host="127.0.0.1", port=0)
    limits = ServingLimits(max_connections=2, header_timeout=2.0)
    task = asyncio.create_task(host.serve(spec, factory, limits=limits))
    try:
        port = await _wait_for(lambda: _ready_port(capsys))
        r, w = await _open(port)
        assert await _get(r, w) == 200
        closed, sent = await _trickle(port, b"", HEAD, 8)
        assert closed and sent < len(HEAD)
        w.transport.abort()
    finally:
        if not task.done():
            signal.raise_signal(signal.SIGTERM)  # serve's own handler stops it cleanly
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 30)


def test_limits_are_checked() -> None:
    for bad in (
        {"max_connections": 0},
        {"header_timeout": 0},
        {"body_timeout": -1},
        {"keepalive_timeout": float("nan")},
    ):
        with pytest.raises(ValueError):
            ServingLimits(**bad)


def test_default_limits_leave_room_for_the_testbed() -> None:
    """The router holds hundreds of connections to a worker under load."""
    d = ServingLimits()
    assert d.max_connections >= 4096
    assert d.header_timeout >= 10 and d.body_timeout >= 30


# -- malformed requests (issue 33, defect 7) -------------------------------------------------------
MALFORMED = {
    "negative length": b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    "bad request line": b"GARBAGE\r\n\r\n",
    "bad method": b"G(T / HTTP/1.1\r\nHost: x\r\n\r\n",
    "non-numeric length": b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    "bad chunk": b"POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"zz\r\nhello\r\n0\r\n\r\n",
    "bad header": b"GET /hello HTTP/1.1\r\nHost: x\r\nBad Header: 1\r\n\r\n",
    "long line": b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
}


async def _send(port: int, raw: bytes) -> bytes:
    """`raw` on a new connection; what the server answers before it closes (at most 64 KiB)."""
    r, w = await _open(port)
    try:
        w.write(raw)
        await w.drain()
        return await asyncio.wait_for(r.read(65536), 10)
    finally:
        w.transport.abort()


@pytest.mark.parametrize("kind", sorted(MALFORMED))
async def test_malformed_requests_log_one_line_each(
    served: tuple[HttpServer, list[str]], caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    """Before: aiohttp logged an 11-line traceback per request (5,500 lines for 500)."""
    server, done = served
    caplog.set_level(logging.DEBUG)
    n = 100
    for _ in range(n):
        answer = await _send(server.port, MALFORMED[kind])
        assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request"), answer[:80]
    await _wait_idle(server)
    assert done == []
    _assert_quiet(caplog, n)
    assert any(r.getMessage().startswith("http: ") for r in caplog.records)
    r, w = await _open(server.port)
    assert await _get(r, w) == 200
    w.transport.abort()


async def test_a_bad_chunk_mid_body_is_a_400_at_once(caplog: pytest.LogCaptureFixture) -> None:
    """A chunk size that breaks the parser after the body began: a 400 in one line, not a
    handler left waiting for its body until the deadline (aiohttp's C parser) nor a 500 with
    two tracebacks (its Python parser)."""
    caplog.set_level(logging.DEBUG)
    done: list[str] = []
    server = await start_http(_app(done), limits=ServingLimits(body_timeout=300.0))
    try:
        r, w = await _open(server.port)
        head = b"POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        w.write(head + b"5\r\nhello\r\n")
        await w.drain()
        await asyncio.sleep(0.2)  # the handler is reading the body now
        w.write(b"zz\r\nmore\r\n0\r\n\r\n")
        answer = await asyncio.wait_for(r.read(65536), 30)  # well inside the 300 s deadline
        w.transport.abort()
        assert answer.startswith(b"HTTP/1.1 400"), answer[:80]
        assert b"bad request body" in answer
        await _wait_idle(server)
        assert done == [] and server.cut == 0
        _assert_quiet(caplog, 1)
    finally:
        await server.close()


async def test_a_handler_bug_keeps_its_traceback(
    served: tuple[HttpServer, list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    server, _ = served
    caplog.set_level(logging.DEBUG)
    answer = await _send(server.port, b"GET /bug HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 500")
    bugs = [r for r in caplog.records if r.exc_info and isinstance(r.exc_info[1], RuntimeError)]
    assert len(bugs) == 1 and "a bug in a handler" in caplog.text


# -- helpers -------------------------------------------------------------------------------------
_ready: dict[str, int] = {}


def _ready_port(capsys: pytest.CaptureFixture[str]) -> int | None:
    out = capsys.readouterr().out
    for line in out.splitlines():
        if line.startswith("READY "):
            _ready["port"] = int(json.loads(line[6:])["http"])
    return _ready.pop("port", None)


async def _wait_for(cond: Any, seconds: float = 10.0) -> Any:
    """Poll `cond` (bounded) until it returns something truthy."""
    for _ in range(int(seconds / 0.01)):
        value = cond()
        if value:
            return value
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def _wait_idle(server: HttpServer) -> None:
    await _wait_for(lambda: server.connections == 0)


def _assert_quiet(caplog: pytest.LogCaptureFixture, at_most: int) -> None:
    records = [r for r in caplog.records if r.name.startswith(("aiohttp", "testbed"))]
    assert not [r for r in records if r.exc_info], [r.getMessage() for r in records[:3]]
    assert all("\n" not in r.getMessage() for r in records)
    assert len(records) <= at_most, [r.getMessage() for r in records[:5]]
