"""A proxy: a listening socket, its upstream address, its toxics and its open connections.

Each accepted client gets a Connection: the client socket is paused until the upstream
connection is up (with a timeout), then two ToxicLinks move bytes, one per direction, each built
from the proxy's current chain for that direction. Both sockets use asyncio Protocols with flow
control (pause_reading / pause_writing), so memory stays bounded whatever the peers do.

Ending a connection: an EOF travels down its direction and half-closes the other side (the
connection closes when both directions have ended); CLOSE (timeout, limit_data) closes both
sockets after what is buffered is written; reset (reset_peer) aborts both with RST. Disabling or
deleting a proxy closes its connections, as Toxiproxy does.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import struct
from collections.abc import Callable, Iterator
from typing import Any, cast

from testbed.link.acceptor import RESOURCE_ERRNOS, Acceptor, descriptor_room
from testbed.link.addr import format_hostport, parse_hostport
from testbed.link.collection import ToxicCollection
from testbed.link.errors import ApiError
from testbed.link.pipeline import LinkStats, Sink, ToxicLink
from testbed.transfer.netns import socket_in_namespace

__all__ = ["DIRECTIONS", "Connection", "Proxy"]

_log = logging.getLogger(__name__)

DIRECTIONS = ("upstream", "downstream")
CONNECT_TIMEOUT = 10.0  # seconds to reach the upstream before the client is dropped
CLOSE_GRACE = 5.0  # seconds a closing socket may spend flushing before it is aborted
WRITE_HIGH = 1024 * 1024  # transport write buffer high-water mark (bytes)
LISTEN_BACKLOG = 1024


class _Side(asyncio.Protocol):
    """One socket of a connection: feeds `out_dir` and is the sink of the other direction."""

    def __init__(self, conn: Connection, out_dir: str, in_dir: str) -> None:
        self.conn = conn
        self.out_dir = out_dir
        self.in_dir = in_dir
        self.transport: asyncio.Transport | None = None
        self.gone = False
        self.early: list[bytes] = []
        self.early_eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        t = cast(asyncio.Transport, transport)
        self.transport = t
        t.set_write_buffer_limits(high=WRITE_HIGH)

    def data_received(self, data: bytes) -> None:
        link = self.conn.links.get(self.out_dir)
        if link is not None:
            link.feed(data)
            return
        # Before the upstream is connected (uvloop may start reading despite pause_reading in
        # connection_made): hold the bytes and stop reading until the links exist.
        self.early.append(data)
        if self.transport is not None:
            with contextlib.suppress(RuntimeError):
                self.transport.pause_reading()

    def eof_received(self) -> bool:
        link = self.conn.links.get(self.out_dir)
        if link is not None:
            link.feed_eof()
        else:
            self.early_eof = True
        return True  # keep the socket open for the other direction (half-close)

    def flush_early(self) -> None:
        """Feed what arrived before the links existed."""
        link = self.conn.links[self.out_dir]
        early, self.early = self.early, []
        for data in early:
            link.feed(data)
        if self.early_eof:
            link.feed_eof()

    def pause_writing(self) -> None:
        link = self.conn.links.get(self.in_dir)
        if link is not None:
            link.sink_paused()

    def resume_writing(self) -> None:
        link = self.conn.links.get(self.in_dir)
        if link is not None:
            link.sink_resumed()

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.lost(self)


class _ClientSide(_Side):
    def __init__(self, proxy: Proxy) -> None:
        super().__init__(Connection(proxy), "upstream", "downstream")

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert self.transport is not None
        self.transport.pause_reading()
        self.conn.client = self
        self.conn.proxy.accepted(self.conn)


class Connection:
    """One client connection through a proxy and its upstream connection."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self.index = proxy.next_index()
        self.client: _Side | None = None
        self.upstream: _Side | None = None
        self.links: dict[str, ToxicLink] = {}
        self.closed = False
        self._timers: list[asyncio.TimerHandle] = []

    async def connect(self) -> None:
        """Dial the upstream, then start both directions and let the client's bytes flow."""
        proxy = self.proxy
        loop = proxy.loop
        host, port = parse_hostport(proxy.upstream, "upstream")
        try:
            await asyncio.wait_for(
                loop.create_connection(lambda: self._upstream_side(), host, port),
                CONNECT_TIMEOUT,
            )
        except (OSError, TimeoutError) as exc:
            _log.info("proxy %s: cannot reach upstream %s: %s", proxy.name, proxy.upstream, exc)
            self.close()
            return
        if self.closed or self.client is None or self.upstream is None:
            self.close()
            return
        ct, ut = self.client.transport, self.upstream.transport
        assert ct is not None and ut is not None
        seed = proxy.seed_base(self.index)
        for direction, src, dst in (("upstream", ct, ut), ("downstream", ut, ct)):
            stats = proxy.stats[direction]
            link = ToxicLink(loop, direction, self, src, Sink(dst, stats), stats, seed)
            for wrapper in proxy.toxics.chain(direction):
                link.add_toxic(wrapper)
            self.links[direction] = link
        self.client.flush_early()
        self.upstream.flush_early()
        if not self.closed:
            self.links["upstream"].maybe_resume_after_setup()
            self.links["downstream"].maybe_resume_after_setup()

    def _upstream_side(self) -> _Side:
        side = _Side(self, "downstream", "upstream")
        self.upstream = side
        return side

    def _transports(self) -> Iterator[asyncio.Transport]:
        for side in (self.client, self.upstream):
            if side is not None and side.transport is not None:
                yield side.transport

    def direction_done(self, link: ToxicLink) -> None:
        """A direction delivered its EOF: half-close its sink; close when both are done."""
        if self.closed:
            return
        t = link.sink.transport
        with contextlib.suppress(OSError, RuntimeError):
            if t.can_write_eof() and not t.is_closing():
                t.write_eof()
        if all(lk.done for lk in self.links.values()) and len(self.links) == 2:
            self.close()

    def close(self) -> None:
        """Close both sockets once their buffers are written (aborted after a grace period)."""
        if self.closed:
            return
        self.closed = True
        self.proxy.forget(self)
        for link in self.links.values():
            link.cancel()
        loop = self.proxy.loop
        for t in self._transports():
            if not t.is_closing():
                t.close()
            self._timers.append(loop.call_later(CLOSE_GRACE, t.abort))

    def reset(self) -> None:
        """Abort both sockets so each peer sees a TCP RST."""
        for t in self._transports():
            sock = t.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.closed = True
        self.proxy.forget(self)
        for link in self.links.values():
            link.cancel()
        for t in self._transports():
            t.abort()

    def lost(self, side: _Side) -> None:
        """A socket closed (by us, or by its peer with an error or RST)."""
        side.gone = True
        link = self.links.get(side.in_dir)
        if link is not None:
            link.sink.lost()
        if not self.closed:
            self.close()
        if all(s is None or s.gone for s in (self.client, self.upstream)):
            for h in self._timers:
                h.cancel()
            self._timers.clear()


class Proxy:
    """A named proxy: listen address, upstream, enabled flag, toxics and connections."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        name: str,
        listen: str,
        upstream: str,
        seed: Callable[[], int | None],
        shared: dict[Any, Any] | None = None,
        listen_netns: str | None = None,
    ) -> None:
        parse_hostport(listen, "listen")
        parse_hostport(upstream, "upstream")
        self.loop = loop
        self.name = name
        self.listen = listen
        self.upstream = upstream
        self.enabled = False
        self._seed = seed
        self.listen_netns = listen_netns
        """The network namespace its listening socket is made in (kernel-shaped link); None:
        the emulator's own."""
        self.toxics = ToxicCollection(loop, self.live_links, shared)
        self.connections: set[Connection] = set()
        self.stats = {d: LinkStats() for d in DIRECTIONS}
        self._acceptor: Acceptor | None = None  # accepts on the listening socket while enabled
        self._pending: set[asyncio.Task[None]] = set()
        self._count = 0

    # -- bookkeeping -------------------------------------------------------------------------
    def next_index(self) -> int:
        self._count += 1
        return self._count

    def reset_indices(self) -> None:
        self._count = 0

    def seed_base(self, index: int) -> str | None:
        seed = self._seed()
        return None if seed is None else f"{seed}/{self.name}/{index}"

    def live_links(self) -> Iterator[ToxicLink]:
        for conn in list(self.connections):
            yield from conn.links.values()

    def accepted(self, conn: Connection) -> None:
        if not self.enabled:
            conn.close()
            return
        self.connections.add(conn)
        task = self.loop.create_task(conn.connect())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def forget(self, conn: Connection) -> None:
        self.connections.discard(conn)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "listen": self.listen,
            "upstream": self.upstream,
            "enabled": self.enabled,
            "toxics": self.toxics.to_json(),
        }

    # -- lifecycle ---------------------------------------------------------------------------
    async def _resolve(self, listen: str) -> tuple[int, Any]:
        """(family, sockaddr) to bind for `listen`, preferring IPv4; a 400 if it cannot be."""
        host, port = parse_hostport(listen, "listen")
        try:
            infos = await self.loop.getaddrinfo(
                host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )
        except OSError as exc:
            raise ApiError(f"listen {listen}: {exc}", 400) from None
        if not infos:  # pragma: no cover - getaddrinfo raises instead
            raise ApiError(f"listen {listen}: no such address", 400)
        infos.sort(key=lambda i: i[0] != socket.AF_INET)
        family, _, _, _, sockaddr = infos[0]
        return family, sockaddr

    def _bind(self, listen: str, family: int, sockaddr: Any) -> socket.socket:
        """A listening socket on `sockaddr`, or an ApiError: 409 if the address is taken, 503
        if the process is short of descriptors (the connections keep what is left)."""
        short = descriptor_room()
        if short is not None:
            raise ApiError(f"listen tcp {listen}: {short}", 503)
        try:
            if self.listen_netns is None:
                sock = socket.socket(family, socket.SOCK_STREAM)
            else:
                sock = socket_in_namespace(self.listen_netns, socket.SOCK_STREAM, family)
        except OSError as exc:
            status = 503 if exc.errno in RESOURCE_ERRNOS else 500
            raise ApiError(f"listen tcp {listen}: {exc.strerror or exc}", status) from None
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(sockaddr)
            sock.listen(LISTEN_BACKLOG)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            raise _bind_error(listen, exc) from None
        return sock

    async def _serve(self, sock: socket.socket) -> None:
        """Start accepting on a bound socket; the proxy is enabled at its real address."""
        addr = sock.getsockname()
        self._acceptor = Acceptor(self.loop, sock, lambda: _ClientSide(self), self.name)
        self.listen = format_hostport(addr[0], addr[1])
        self.enabled = True

    def _bound_to(self) -> Any:
        """The address the listening socket is bound to, or None when disabled."""
        return None if self._acceptor is None else self._acceptor.sock.getsockname()

    async def start(self) -> None:
        if self.enabled:
            return
        family, sockaddr = await self._resolve(self.listen)
        await self._serve(self._bind(self.listen, family, sockaddr))

    def _drop_connections(self) -> None:
        for task in list(self._pending):
            task.cancel()
        for conn in list(self.connections):
            conn.close()

    async def stop(self) -> None:
        if not self.enabled:
            return
        self.enabled = False
        acceptor, self._acceptor = self._acceptor, None
        if acceptor is not None:
            await acceptor.stop()
        self._drop_connections()

    async def update(self, listen: str, upstream: str, enabled: bool) -> None:
        """Apply a ProxyUpdate: a new address or upstream restarts the proxy (dropping its
        connections, as Toxiproxy does).

        A new address is bound before anything changes: if it is taken (409) or cannot be
        bound (400), the proxy keeps its address, its state and its open connections.
        """
        parse_hostport(listen, "listen")
        parse_hostport(upstream, "upstream")
        if listen == self.listen and upstream == self.upstream:
            if enabled and not self.enabled:
                await self.start()
            elif not enabled and self.enabled:
                await self.stop()
            return
        if not enabled:  # only written down; bound when the proxy is enabled
            await self.stop()
            self.listen, self.upstream = listen, upstream
            return
        bound = self._bound_to()
        family, sockaddr = await self._resolve(listen)
        if bound is not None and tuple(bound[:2]) == tuple(sockaddr[:2]):
            # The same address written another way, or only the upstream changed: keep the
            # listening socket and restart the connections.
            self._drop_connections()
            self.upstream = upstream
            return
        sock = self._bind(listen, family, sockaddr)  # raises before anything has changed
        await self.stop()
        self.upstream = upstream
        await self._serve(sock)  # sets `listen` to the address it is bound to


def _bind_error(listen: str, exc: OSError) -> ApiError:
    """Toxiproxy's wording ("listen tcp ADDR: bind: ..."); 409 when another socket has it."""
    reason = (exc.strerror or str(exc)).lower()
    if exc.errno == errno.EADDRINUSE:
        status = 409
    elif exc.errno in _CALLER_ERRNOS:
        status = 400
    elif exc.errno in RESOURCE_ERRNOS:
        status = 503  # out of descriptors or memory: the server's, for now
    else:
        status = 500  # the server's own trouble
    return ApiError(f"listen tcp {listen}: bind: {reason}", status)


# bind() failures that are the caller's address, not the server's state
_CALLER_ERRNOS = frozenset(
    {errno.EADDRNOTAVAIL, errno.EACCES, errno.EPERM, errno.EINVAL, errno.EAFNOSUPPORT}
)
