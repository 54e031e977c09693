"""Serve an aiohttp app with limits on how clients may read it: one place for every HTTP server.

aiohttp 3.14 bounds the size of a request (max_line_size, max_field_size, max_headers; the app's
client_max_size for the body) and closes idle keep-alive connections (keepalive_timeout), but it
has no deadline for receiving a request and no cap on connections: a client that sends its
headers one byte a second, or its body never, holds a connection and a handler forever, and
enough of them exhaust the process's file descriptors. `start_http` adds what is missing:

- a connection cap: beyond `max_connections` open connections a new one gets a 503 and is
  closed at once; the open ones are not disturbed;
- a deadline for a request's head (`header_timeout`, from its first byte to the end of its
  headers) and for its body (`body_timeout`, from the end of the headers to the last body byte);
  a client that misses one is disconnected. Responses are not limited: a handler may stream for
  as long as it likes once it has its request;
- one log line at most for a request whose client went away mid-body (aiohttp and most
  handlers would log a traceback each time);
- one log line at most for a malformed request (a bad request line, a `Content-Length: -1`, a
  broken chunked body), which aiohttp logs with a traceback (testbed.serving.bad_requests); a
  handler's own exception keeps its traceback;
- the browser guard (testbed.serving.browser_guard): a state-changing request a web page could
  have sent cross-site is a 403 before any handler runs.

Everything else is aiohttp's own: the limits object also carries its knobs, so a server's whole
reading policy is one `ServingLimits`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from testbed.serving.bad_requests import ServerLog, one_line, parse_error, reported
from testbed.serving.browser_guard import REFUSE_BROWSERS, browser_refusal

__all__ = [
    "DEFAULT_LIMITS",
    "REFUSE_BROWSERS",
    "HttpServer",
    "ServingLimits",
    "browser_refusal",
    "start_http",
]

_log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_REFUSED_BODY = b'{"error": "too many connections", "status": 503}\n'
_REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_REFUSED_BODY), _REFUSED_BODY)
)


@dataclass(frozen=True)
class ServingLimits:
    """How much a server lets its clients take. Seconds for timeouts.

    The defaults stay out of the testbed's way: the router keeps hundreds of connections open
    to a worker under load and streams responses for minutes, while its requests are small and
    arrive over loopback or a datacenter network in milliseconds.
    """

    max_connections: int = 4096
    """Open connections at most; further ones get a 503 and are closed."""
    header_timeout: float = 20.0
    """Seconds from a request's first byte to the end of its headers."""
    body_timeout: float = 60.0
    """Seconds from the end of a request's headers to the end of its body."""
    keepalive_timeout: float = 75.0
    """Seconds an idle keep-alive connection stays open (aiohttp's knob; longer than aiohttp
    clients' 15 s, so the client side closes first and never reuses a closing connection)."""
    max_line_size: int = 8190
    """Longest request line, in bytes (aiohttp's knob and default)."""
    max_field_size: int = 8190
    """Longest header, in bytes (aiohttp's knob and default)."""
    max_headers: int = 128
    """Most headers in a request (aiohttp's knob and default)."""
    lingering_time: float = 10.0
    """Seconds spent discarding an unread request body after the response (aiohttp's knob)."""
    handler_cancellation: bool = False
    """Cancel a handler when its client disconnects (aiohttp's knob; off, as the services
    finish their bookkeeping when the client is gone)."""

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {self.max_connections}")
        for name in (
            "header_timeout",
            "body_timeout",
            "keepalive_timeout",
            "lingering_time",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        for name in ("max_line_size", "max_field_size", "max_headers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")

    def aiohttp_kwargs(self) -> dict[str, Any]:
        """The knobs aiohttp has itself, as AppRunner keyword arguments."""
        return {
            "keepalive_timeout": self.keepalive_timeout,
            "max_line_size": self.max_line_size,
            "max_field_size": self.max_field_size,
            "max_headers": self.max_headers,
            "lingering_time": self.lingering_time,
            "handler_cancellation": self.handler_cancellation,
        }


DEFAULT_LIMITS = ServingLimits()


def _json_error(status: int, message: str) -> web.Response:
    body = json.dumps({"error": message, "status": status})
    return web.Response(text=body, status=status, content_type="application/json")


class _Gate:
    """The open connections of one server, by their aiohttp request handler."""

    def __init__(self, limits: ServingLimits, name: str) -> None:
        self.limits = limits
        self.name = name
        self.open: dict[object, _Connection] = {}
        self.refused = 0
        self.cut = 0
        self._saturated = False

    def refuse(self, transport: asyncio.Transport) -> None:
        self.refused += 1
        if not self._saturated:
            self._saturated = True
            _log.warning(
                "%s: %d connections open, the cap; refusing new ones",
                self.name,
                self.limits.max_connections,
            )
        with contextlib.suppress(Exception):
            transport.write(_REFUSED)
            transport.close()

    def closed(self, inner: object) -> None:
        self.open.pop(inner, None)
        if self._saturated and len(self.open) < self.limits.max_connections:
            self._saturated = False
            _log.info(
                "%s: accepting connections again (%d refused so far)",
                self.name,
                self.refused,
            )


class _Connection(asyncio.Protocol):
    """Wraps aiohttp's protocol for one connection: counts it and enforces the deadlines.

    aiohttp parses; this only watches. A connection is either between requests (idle), reading
    a request head (from its first byte until the app middleware sees the request) or in a
    request (its body may still be arriving). Deadlines run in the second and third states.
    """

    def __init__(self, gate: _Gate, make_inner: Callable[[], asyncio.Protocol]) -> None:
        self.gate = gate
        self._make_inner = make_inner
        self.inner: asyncio.Protocol | None = None
        self.transport: asyncio.Transport | None = None
        self.request: web.BaseRequest | None = None
        self.cut: str | None = None  # what the client failed to send in time, once cut
        self._timer: asyncio.TimerHandle | None = None
        self._next_started = False  # bytes of a pipelined request came during this one

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        t = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it
        self.transport = t
        if len(self.gate.open) >= self.gate.limits.max_connections:
            self.gate.refuse(t)
            return
        inner = self._make_inner()
        self.inner = inner
        self.gate.open[inner] = self
        inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        inner = self.inner
        if inner is None:
            return
        req = self.request
        if req is None:
            if self._timer is None and self.cut is None:
                self._arm(self.gate.limits.header_timeout, "request head")
        elif req.content.is_eof():
            self._next_started = True
        inner.data_received(data)
        if req is not None and not req.content.is_eof():
            self._body_error(inner, req)

    @staticmethod
    def _body_error(inner: asyncio.Protocol, req: web.BaseRequest) -> None:
        """Hand a body's parse error to the handler reading that body.

        aiohttp's C parser, failing mid-body (a bad chunk size after the first chunks), queues
        the error as if it were the next request and leaves the current body open: its handler
        would wait for bytes that never come, until the body deadline. aiohttp's pure-Python
        parser sets the error on the body itself, which is what this does. (Private aiohttp
        state, read defensively: if it changes, the body deadline still ends the request.)
        """
        queued = getattr(inner, "_messages", None)
        if not queued:
            return
        last = queued[-1][0]
        exc = getattr(last, "exc", None)
        if isinstance(exc, HttpProcessingError) and req.content.exception() is None:
            req.content.set_exception(exc)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        inner, self.inner = self.inner, None
        if inner is not None:
            self.gate.closed(inner)
            inner.connection_lost(exc)

    # -- requests (called by the middleware) -----------------------------------------------
    def request_started(self, request: web.BaseRequest) -> None:
        self._disarm()
        self.request = request
        self._next_started = False
        if not request.content.is_eof():
            self._arm(self.gate.limits.body_timeout, "request body")

    def request_done(self) -> None:
        self._disarm()
        self.request = None
        if self._next_started and self.cut is None:
            self._arm(self.gate.limits.header_timeout, "request head")

    # -- deadlines -------------------------------------------------------------------------
    def _arm(self, seconds: float, what: str) -> None:
        self._disarm()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(seconds, self._late, what, seconds)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _late(self, what: str, seconds: float) -> None:
        self._timer = None
        req = self.request
        if what == "request body" and (req is None or req.content.is_eof()):
            return  # it arrived in time
        if what == "request head" and req is not None:
            return
        t = self.transport
        if t is None or t.is_closing() or self.inner is None:
            return
        self.cut = what
        self.gate.cut += 1
        peer = t.get_extra_info("peername")
        msg = "%s: closed connection from %s: %s not received within %g s"
        _log.info(msg, self.gate.name, peer, what, seconds)
        t.abort()


def _middleware(gate: _Gate) -> Any:
    @web.middleware
    async def serving_limits(request: web.Request, handler: Handler) -> web.StreamResponse:
        conn = gate.open.get(request.protocol)
        if conn is None:  # pragma: no cover - every request comes through a _Connection
            return await handler(request)
        conn.request_started(request)
        try:
            refused = browser_refusal(request, strict=request.app.get(REFUSE_BROWSERS, False))
            if refused is not None:
                _log.info(
                    "%s: %s %s refused: %s",
                    gate.name,
                    request.method,
                    request.path,
                    refused,
                )
                return _json_error(403, refused)
            return await handler(request)
        except ConnectionError as exc:
            t = request.transport
            if t is not None and not t.is_closing():
                raise  # not this client's connection (say, a call the handler made)
            if conn.cut is None:  # a cut connection has had its one line already
                msg = "%s: %s %s: client went away before the request was read (%s)"
                why = str(exc) or type(exc).__name__
                _log.debug(msg, gate.name, request.method, request.path, why)
            # Nobody will read this: aiohttp drops it quietly on the closed connection.
            return web.Response(status=499)
        except Exception as exc:
            if (bad := parse_error(exc)) is None:
                raise
            # The request's body broke aiohttp's parser mid-read (a bad chunk, say): the
            # client's error, one line, a 400; the connection cannot carry another request.
            if not reported(bad):
                msg = "%s: %s %s: bad request body from %s: %s"
                _log.info(
                    msg,
                    gate.name,
                    request.method,
                    request.path,
                    request.remote,
                    one_line(bad),
                )
            resp = _json_error(400, f"bad request body: {one_line(bad)}")
            resp.force_close()
            return resp
        finally:
            conn.request_done()

    return serving_limits


class HttpServer:
    """A running app: its address, its connection counts, and `close()`."""

    def __init__(self, runner: web.AppRunner, server: asyncio.Server, gate: _Gate) -> None:
        self.runner = runner
        self._server = server
        self._gate = gate
        sockname = server.sockets[0].getsockname() if server.sockets else ("", 0)
        self.host: str = sockname[0]
        self.port: int = sockname[1]

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self._gate.open)

    @property
    def refused(self) -> int:
        """Connections refused so far because the cap was reached."""
        return self._gate.refused

    @property
    def cut(self) -> int:
        """Connections closed so far for missing a head or body deadline."""
        return self._gate.cut

    async def close(self) -> None:
        """Stop listening, then shut the app down as aiohttp does (open requests may finish)."""
        self._server.close()
        await self.runner.cleanup()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 1.0)


async def start_http(
    app: web.Application,
    *,
    host: str | None = "127.0.0.1",
    port: int = 0,
    sock: socket.socket | None = None,
    limits: ServingLimits = DEFAULT_LIMITS,
    backlog: int = 128,
    name: str = "http",
    shutdown_timeout: float = 60.0,
) -> HttpServer:
    """Serve `app` on host:port (port 0 picks one) or on a bound `sock`, within `limits`.

    `name` prefixes the server's log lines. The app must not be running yet: a middleware is
    added to it (outermost) to see each request arrive, apply the browser guard and answer a
    malformed body. An app that sets REFUSE_BROWSERS refuses browsers outright.
    """
    app.middlewares.insert(0, _middleware(gate := _Gate(limits, name)))
    runner = web.AppRunner(
        app,
        handle_signals=False,
        access_log=None,
        shutdown_timeout=shutdown_timeout,
        logger=ServerLog(name),
        **limits.aiohttp_kwargs(),
    )
    await runner.setup()
    inner = runner.server
    assert inner is not None
    loop = asyncio.get_running_loop()
    try:
        if sock is not None:
            server = await loop.create_server(
                lambda: _Connection(gate, inner), sock=sock, backlog=backlog
            )
        else:
            server = await loop.create_server(
                lambda: _Connection(gate, inner),
                host,
                port,
                backlog=backlog,
                reuse_address=True,
            )
    except BaseException:
        await runner.cleanup()
        raise
    return HttpServer(runner, server, gate)
