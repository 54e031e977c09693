"""The receiver's server: listening, admitting connections, their watchdogs, and the owner's API
(expect / wait / discard / take_payload) over the reassembler.

Deadlines are enforced by one watchdog task per connection that wakes every `check_interval`
seconds (idle connection, frame stalled halfway, ACKs not draining), instead of arming timers per
frame: per-frame timers cost more CPU than checksumming the payload.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from testbed.transfer.buffers import BufferBudget
from testbed.transfer.reassembly import KVManifest, Reassembler
from testbed.transfer.receiver.protocol import Connection
from testbed.transfer.wire import DEFAULT_MAX_PAYLOAD, WireError

__all__ = ["KVReceiver", "ReceiverStats"]

log = logging.getLogger(__name__)


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
        self._conns: set[Connection] = set()
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
                lambda: Connection(self), self._host, self._port
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

    # ------------------------------------------- connections (ConnectionOwner: for Connection only)

    def admit(self, conn: Connection) -> bool:
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

    def dropped(self, conn: Connection, exc: Exception | None) -> None:
        """The connection is gone (its watchdog ends by itself)."""
        self._conns.discard(conn)
        if exc is not None:
            log.debug("KV connection from %s lost: %r", conn.peer, exc)

    def protocol_error(self, conn: Connection, exc: WireError) -> None:
        """Undecodable input: count it and drop the connection (RST)."""
        self._protocol_errors += 1
        log.warning("dropping KV connection from %s: %s", conn.peer, exc)
        conn.abort()

    async def _watchdog(self, conn: Connection) -> None:
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
