"""The decode side of a KV transfer: a TCP server that reassembles and verifies requests.

A decode instance runs one `KVReceiver`. Senders (PrfaaS prefill across the link, PD-P prefill
inside the cluster) open several connections to it and stripe each request's frames across them;
the rules for when a request is complete or failed live in `reassembly.py`, this module is the
network side.

Speed matters here (hundreds of MB/s on a 2-core machine shared with other processes), so each
connection is an `asyncio.BufferedProtocol`: the kernel copies bytes straight into one reusable
buffer, frames are parsed and checksummed in place through memoryviews, and payload bytes are
never copied again unless `keep_payload=True`. Deadlines are enforced by one watchdog task per
connection that wakes every `check_interval` seconds (idle connection, frame stalled halfway, ACKs
not draining), instead of arming timers per frame.

Backpressure: if the sender stops reading ACKs, the transport pauses writing and the connection
stops reading frames until it resumes, so nothing grows without bound.

Hostile peers: any local process can connect. What it can make the receiver hold is bounded:
frames for ids the owner did not `expect` create no state (reassembly.py); a connection's buffer
grows only with bytes that really arrived, all buffers share one BufferBudget (buffers.py), the
number of connections is capped (more are refused at once), and expected requests past their
deadline are failed and freed by the supervisor every `check_interval`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from testbed.transfer.buffers import BufferBudget
from testbed.transfer.reassembly import KVManifest, Reassembler, ReceiverFull
from testbed.transfer.wire import (
    DEFAULT_MAX_PAYLOAD,
    HEADER_SIZE,
    ChecksumMismatch,
    Header,
    WireError,
    decode_body,
    decode_header,
    encode_frame,
)

__all__ = ["KVManifest", "KVReceiver", "ReceiverFull", "ReceiverStats"]

log = logging.getLogger(__name__)

_MIN_FREE = 16 << 10  # never offer the kernel less than this much buffer space
_INITIAL_BUFFER = 64 << 10  # a connection's buffer before any bytes arrived
_STREAM_BUFFER = 1 << 20  # what a connection that keeps streaming grows to (fewer copies)


@dataclass(frozen=True, slots=True)
class ReceiverStats:
    """Counters since start. Byte counts are payload bytes; duplicates are counted apart."""

    bytes_received: int  # unique payload bytes accepted
    bytes_duplicate: int
    frames: int  # all frames read, of any type, including corrupt ones
    checksum_failures: int
    protocol_errors: int  # connections dropped for undecodable input
    timeouts: int  # connections dropped by the watchdog
    connections_open: int
    connections_total: int
    requests_active: int
    requests_completed: int
    requests_failed: int
    requests_tracked: int  # expected and not discarded yet, in any state
    requests_retired: int  # discarded, remembered for late duplicates
    requests_expired: int  # failed and freed at their deadline
    frames_refused: int  # frames for ids nobody expected: answered FAILED, no state kept
    connections_refused: int  # beyond max_connections
    payload_bytes: int  # KV bytes kept for requests (keep_payload)
    buffer_bytes: int  # read buffers of all connections


class _Connection(asyncio.BufferedProtocol):
    """One sender connection: parse frames in place, hand them to the reassembler, ACK.

    The read buffer starts small and grows only when the bytes that really arrived fill it
    (see `_grow`), within the receiver's BufferBudget; a header's promise alone allocates
    nothing, and an idle connection's buffer shrinks back.
    """

    def __init__(self, receiver: KVReceiver) -> None:
        self._rx = receiver
        self._buf = bytearray()
        self._view = memoryview(self._buf)
        self._start = 0  # first unparsed byte
        self._end = 0  # one past the last received byte
        self._header: Header | None = None  # parsed header of a frame whose rest is pending
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.last_activity = time.monotonic()
        self.frame_started: float | None = None
        self.write_paused_since: float | None = None
        self.peer: object = None
        self._paused_acks = False  # the sender does not read its ACKs
        self._paused_memory = False  # the buffer is full and the budget allows no more
        self._received = 0  # bytes received so far

    @property
    def buffer_size(self) -> int:
        return len(self._buf)

    # asyncio callbacks ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it: cast, not check.
        self.transport = cast(asyncio.Transport, transport)
        self.peer = transport.get_extra_info("peername")
        if self._rx._connection_made(self):
            self._set_buffer(bytearray(_INITIAL_BUFFER))
            self._rx.budget.force(_INITIAL_BUFFER)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        budget = self._rx.budget
        budget.forget(self)
        size = len(self._buf)
        self._set_buffer(bytearray())
        if size:
            budget.give(self, size, done=True)
        self._rx._connection_lost(self, exc)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._start == self._end:
            self._start = self._end = 0
        short = len(self._buf) - self._end < _MIN_FREE
        if short and not self._grow() and self._end == len(self._buf):
            # Reading pauses before the buffer fills (buffer_updated); never offer nothing.
            self._rx.budget.force(_MIN_FREE)
            self._resize(len(self._buf) + _MIN_FREE)
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        self._end += nbytes
        self._received += nbytes
        self.last_activity = time.monotonic()
        try:
            self._parse()
        except WireError as exc:
            self._rx._protocol_error(self, exc)
            return
        except Exception:  # a bug must not take the receiver down; drop this connection loudly
            log.exception("unexpected error on KV connection from %s", self.peer)
            self.abort()
            return
        if self._start == self._end and self._header is None:
            self._start = self._end = 0
            budget = self._rx.budget
            if len(self._buf) > _INITIAL_BUFFER and (budget.pressed or budget.overdraft is self):
                self.shrink()
        short = len(self._buf) - self._end < _MIN_FREE
        if short and not self._grow() and self._end == len(self._buf):
            self._paused_memory = True
            self._rx.budget.wait(self)
            self._update_reading()

    def eof_received(self) -> bool | None:
        if self._start != self._end or self._header is not None:
            log.info("KV connection from %s closed inside a frame", self.peer)
        return None  # close the transport

    def pause_writing(self) -> None:
        # The sender is not reading ACKs: stop reading its frames until it catches up.
        self.write_paused_since = time.monotonic()
        self._paused_acks = True
        self._update_reading()

    def resume_writing(self) -> None:
        self.write_paused_since = None
        self._paused_acks = False
        self._update_reading()

    def _update_reading(self) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        if self._paused_acks or self._paused_memory:
            t.pause_reading()
        else:
            t.resume_reading()

    # buffer --------------------------------------------------------------------------------

    def _set_buffer(self, buf: bytearray) -> None:
        self._buf = buf
        self._view = memoryview(buf)

    def _resize(self, size: int) -> None:
        """Move the unparsed bytes into a new buffer of `size` bytes (never a resize in place:
        memoryviews of the old one may still be alive)."""
        held = self._end - self._start
        new = bytearray(size)
        new[:held] = self._view[self._start : self._end]
        self._set_buffer(new)
        self._start, self._end = 0, held

    def _grow(self) -> bool:
        """Make room for at least _MIN_FREE more bytes; False if the budget allows no more.

        Moving the unparsed bytes to the front is enough while they fill at most half the
        buffer, unless the connection keeps streaming (it sent more than twice the buffer) and
        the buffer is still under _STREAM_BUFFER: then it doubles, so frames are copied forward
        less often. Either way the buffer stays within a few times the bytes the peer really
        sent: a header's promise alone grows nothing."""
        held = self._end - self._start
        size = len(self._buf)
        room = size - held >= _MIN_FREE
        streaming = size < _STREAM_BUFFER and self._received > 2 * size
        if room and held <= size // 2 and not streaming:
            self._compact()
            return True
        if self._rx.budget.take(self, max(2 * size, held + _MIN_FREE) - size):
            self._resize(max(2 * size, held + _MIN_FREE))
            return True
        if room:  # no memory to grow into: make do with what is there
            self._compact()
            return True
        return False

    def _compact(self) -> None:
        if self._start:
            held = self._end - self._start
            self._view[:held] = bytes(self._view[self._start : self._end])
            self._start, self._end = 0, held

    def retry_grow(self) -> bool:
        """The budget has memory again: grow and read on (BufferBudget's Waiter)."""
        if self.closed.done():
            return True
        if not self._grow():
            return False
        self._paused_memory = False
        self._update_reading()
        return True

    def shrink(self) -> None:
        """Give an empty buffer's memory back (back to the initial size)."""
        if self._start != self._end or self._header is not None:
            return
        size = len(self._buf)
        if size <= _INITIAL_BUFFER:
            return
        self._set_buffer(bytearray(_INITIAL_BUFFER))
        self._start = self._end = 0
        self._rx.budget.give(self, size - _INITIAL_BUFFER, done=True)

    # parsing -------------------------------------------------------------------------------

    def _parse(self) -> None:
        rx = self._rx
        view = self._view
        while True:
            header = self._header
            if header is None:
                if self._end - self._start < HEADER_SIZE:
                    break
                header = decode_header(
                    view[self._start : self._start + HEADER_SIZE], max_payload=rx.max_payload
                )
                self._start += HEADER_SIZE
                self._header = header
            need = header.rest_len
            if self._end - self._start < need:
                if self.frame_started is None:
                    self.frame_started = time.monotonic()
                break
            rest = view[self._start : self._start + need]
            self._start += need
            self._header = None
            self.frame_started = None
            try:
                ack = rx.reassembler.on_frame(decode_body(header, rest))
            except ChecksumMismatch as exc:
                ack = rx.reassembler.on_corrupt(exc)
            del rest
            if ack is not None and self.transport is not None and not self.transport.is_closing():
                self.transport.writelines(encode_frame(ack))

    def abort(self) -> None:
        """Drop the connection at once (RST): for broken or stalled peers."""
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        """Close gracefully (FIN) after flushing ACKs: for idle peers."""
        if self.transport is not None:
            self.transport.close()


class KVReceiver:
    """Asyncio TCP server receiving KV frames; use `async with` or `start()` / `aclose()`.

    Args:
        host, port: where to listen; port 0 picks a free port (see `.port` after start).
        keep_payload: keep each layer's bytes so `take_payload` can hand them out.
        max_payload: largest DATA frame accepted; bigger frames drop the connection.
        idle_timeout: close a connection that sends nothing for this long (senders reconnect);
            None keeps idle connections for ever.
        frame_timeout: drop a connection whose frame stays half-received this long, or whose
            ACKs cannot be written for this long.
        check_interval: how often the per-connection watchdog checks those deadlines.
        retired_capacity: how many finished-and-discarded requests to remember, so late
            duplicates are answered instead of resurrecting the request.
        max_requests: requests tracked at once; `expect` raises ReceiverFull beyond.
        request_ttl: default deadline (seconds) of an expected request; None: none.
        max_connections: connections open at once; more are dropped as they arrive.
        max_buffer_bytes: read buffers of all connections together (one connection at a time
            may exceed it to finish a frame, see buffers.py).
        on_complete / on_failure: called once per request, from the event loop, when it
            completes (with its manifest) or fails (with its id and reason).
        clock: time source for manifest timestamps.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        keep_payload: bool = False,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        idle_timeout: float | None = 300.0,
        frame_timeout: float = 30.0,
        check_interval: float = 0.5,
        retired_capacity: int = 4096,
        max_requests: int = 16_384,
        request_ttl: float | None = None,
        max_connections: int = 128,
        max_buffer_bytes: int = 64 << 20,
        on_complete: Callable[[KVManifest], None] | None = None,
        on_failure: Callable[[str, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._host = host
        self._port = port
        self.max_payload = max_payload
        self._idle_timeout = idle_timeout
        self._frame_timeout = frame_timeout
        self._check_interval = check_interval
        self.reassembler = Reassembler(
            keep_payload=keep_payload,
            retired_capacity=retired_capacity,
            max_requests=max_requests,
            default_ttl=request_ttl,
            on_complete=on_complete,
            on_failure=on_failure,
            clock=clock,
        )
        self._server: asyncio.Server | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._tg: asyncio.TaskGroup | None = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._conns: set[_Connection] = set()
        self._closing = False
        self._protocol_errors = 0
        self._timeouts = 0
        self._conns_total = 0
        self._conns_refused = 0
        self._max_connections = max_connections
        self.budget = BufferBudget(max_buffer_bytes)

    # ---------------------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> KVReceiver:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Bind and start accepting connections."""
        if self._supervisor is not None:
            raise RuntimeError("receiver already started")
        self._supervisor = asyncio.create_task(self._run(), name="kv-receiver")
        await self._ready.wait()
        try:
            loop = asyncio.get_running_loop()
            self._server = await loop.create_server(
                lambda: _Connection(self), self._host, self._port
            )
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        """Stop listening, drop every connection and wait for their watchdogs to finish."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns):
            conn.abort()
        self._stop.set()
        if self._supervisor is not None:
            await self._supervisor
        if self._server is not None:
            await self._server.wait_closed()

    async def _run(self) -> None:
        # Every connection's watchdog lives in this TaskGroup: closing the receiver ends them all.
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            self._ready.set()
            while not self._stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self._check_interval)
                self.reassembler.expire()
        self._tg = None

    @property
    def port(self) -> int:
        """The bound TCP port (useful with port=0)."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError("receiver is not listening")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def address(self) -> tuple[str, int]:
        return self._host, self.port

    # ---------------------------------------------------------------------------- public API

    def expect(
        self,
        request_id: str,
        *,
        total_bytes: int | None = None,
        ttl: float | None = None,
        label: str | None = None,
    ) -> None:
        """Announce a request before its sender starts: only expected ids are accepted.

        `total_bytes` bounds what its frames may announce; after `ttl` seconds (default:
        request_ttl) it is failed and freed unless discarded; `label` names it in logs.
        ValueError for an id already known, ReceiverFull when max_requests are tracked.
        """
        self.reassembler.expect(request_id, total_bytes=total_bytes, ttl=ttl, label=label)

    async def wait(self, request_id: str, timeout: float | None) -> KVManifest:
        """Wait until `request_id` is complete and verified; return its manifest.

        Raises TransferError (with the reason) if it failed, TimeoutError after `timeout`
        seconds, KeyError if it was never expected. May be called before the first frame.
        """
        return await self.reassembler.wait(request_id, timeout)

    def status(self, request_id: str) -> str | None:
        """'active', 'complete', 'failed', or None if unknown."""
        return self.reassembler.status(request_id)

    def discard(self, request_id: str) -> None:
        """Free a request's state and payload (an active one is failed first)."""
        self.reassembler.discard(request_id)

    def take_payload(self, request_id: str) -> list[bytearray]:
        """A complete request's bytes, one bytearray per layer; needs keep_payload=True."""
        return self.reassembler.take_payload(request_id)

    def stats(self) -> ReceiverStats:
        r = self.reassembler
        return ReceiverStats(
            bytes_received=r.bytes_received,
            bytes_duplicate=r.bytes_duplicate,
            frames=r.frames,
            checksum_failures=r.checksum_failures,
            protocol_errors=self._protocol_errors,
            timeouts=self._timeouts,
            connections_open=len(self._conns),
            connections_total=self._conns_total,
            requests_active=r.active,
            requests_completed=r.completed,
            requests_failed=r.failed,
            requests_tracked=r.tracked,
            requests_retired=r.retired,
            requests_expired=r.expired,
            frames_refused=r.frames_refused,
            connections_refused=self._conns_refused,
            payload_bytes=r.payload_bytes,
            buffer_bytes=sum(c.buffer_size for c in self._conns),
        )

    # ---------------------------------------------------------------------------- connections

    def _connection_made(self, conn: _Connection) -> bool:
        """Admit a new connection (False: it was dropped)."""
        if self._closing or self._tg is None:
            conn.abort()
            return False
        if len(self._conns) >= self._max_connections:
            self._conns_refused += 1
            if self._conns_refused % 1000 == 1:  # a flood must not flood the log too
                log.warning(
                    "refusing KV connections beyond %d (from %s; %d refused so far)",
                    self._max_connections,
                    conn.peer,
                    self._conns_refused,
                )
            conn.abort()
            return False
        self._conns.add(conn)
        self._conns_total += 1
        self._tg.create_task(self._watchdog(conn), name="kv-receiver-watchdog")
        return True

    def _connection_lost(self, conn: _Connection, exc: Exception | None) -> None:
        self._conns.discard(conn)
        if exc is not None:
            log.debug("KV connection from %s lost: %r", conn.peer, exc)

    def _protocol_error(self, conn: _Connection, exc: WireError) -> None:
        self._protocol_errors += 1
        log.warning("dropping KV connection from %s: %s", conn.peer, exc)
        conn.abort()

    async def _watchdog(self, conn: _Connection) -> None:
        try:
            while not conn.closed.done():
                await asyncio.wait([conn.closed], timeout=self._check_interval)
                now = time.monotonic()
                reason = None
                if conn.frame_started is not None and (
                    now - conn.frame_started > self._frame_timeout
                ):
                    reason = f"frame stalled for more than {self._frame_timeout:g}s"
                elif conn.write_paused_since is not None and (
                    now - conn.write_paused_since > self._frame_timeout
                ):
                    reason = f"ACKs not drained for more than {self._frame_timeout:g}s"
                elif self._idle_timeout is not None and (
                    now - conn.last_activity > self._idle_timeout
                ):
                    log.debug("closing idle KV connection from %s", conn.peer)
                    conn.close()
                    return
                elif now - conn.last_activity >= self._check_interval:
                    conn.shrink()  # a quiet connection keeps only its initial buffer
                if reason is not None and not conn.closed.done():
                    self._timeouts += 1
                    log.info("closing KV connection from %s: %s", conn.peer, reason)
                    conn.abort()
                    return
        finally:
            if not conn.closed.done():
                conn.abort()
