"""A sender's connection slots: each keeps one TCP connection to the receiver alive for the
sender's lifetime, and runs its writer, ACK reader and watchdog while it is up.

Each writer takes the next chunk from the one shared queue (least-loaded striping) and hands the
frame to the kernel without copying the payload; the reader applies ACKs to the outbox. Deadlines
(a socket write blocked for `io_timeout`, no ACK for `ack_timeout`) are enforced by one watchdog
per connection rather than timers per frame, which cost more CPU than checksumming the payload.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

from testbed.transfer.checksum import ChecksumAlgo
from testbed.transfer.netns import open_connection_in
from testbed.transfer.sender.outbound import Conn, Kind, ReqState
from testbed.transfer.sender.outbox import Outbox
from testbed.transfer.wire import (
    AbortFrame,
    AckFrame,
    DataFrame,
    EndFrame,
    WireError,
    encode_frame,
    read_frame,
)

__all__ = ["ConnectionSlots"]

log = logging.getLogger(__name__)


class _ConnectionLost(Exception):
    pass


class ConnectionSlots:
    """`connections` slots to one address, feeding from and reporting to one Outbox.

    If every slot fails to connect `reconnect_attempts` times in a row, the receiver is deemed
    unreachable (`unreachable` says why) and the outbox's active requests fail. With `netns`
    the connections are opened inside that network namespace (a kernel-shaped link).
    """

    def __init__(
        self,
        outbox: Outbox,
        host: str,
        port: int,
        connections: int,
        *,
        algo: ChecksumAlgo,
        connect_timeout: float,
        io_timeout: float,
        ack_timeout: float,
        reconnect_attempts: int,
        backoff: float,
        max_backoff: float,
        netns: str | None = None,
    ) -> None:
        self._outbox = outbox
        self._netns = netns
        self._host, self._port = host, port
        self._n = connections
        self._algo = algo
        self._connect_timeout = connect_timeout
        self._io_timeout = io_timeout
        self._ack_timeout = ack_timeout
        self._reconnect_attempts = reconnect_attempts
        self._backoff, self._max_backoff = backoff, max_backoff
        self.conns: set[Conn] = set()
        self._slot_down = [False] * connections
        self.unreachable: str | None = None
        self.closing = False
        """Set by the sender's close before it cancels `run`: the reconnect loop stops on it
        (see `_slot`), whatever shape the cancel reaches it in."""

    async def run(self) -> None:
        """Run every slot until cancelled."""
        async with asyncio.TaskGroup() as tg:
            for i in range(self._n):
                tg.create_task(self._slot(i), name=f"kv-sender-slot-{i}")

    async def _slot(self, index: int) -> None:
        """Keep one connection alive for the sender's lifetime.

        It ends on `closing` as well as on its cancel: a cancel can reach this loop as
        something else (uvloop's connect may answer it with an OSError; the connection's
        TaskGroup, on Python 3.11, with its children's errors when one failed as the cancel
        came), and the loop took it for a lost connection and reconnected, through the link
        emulator that still accepted, forever: a prefill outlived its SIGTERM and was
        SIGKILLed after the runner's 5 s grace in a third to a half of the chaos suite's
        short runs."""
        out = self._outbox
        failures = 0
        connected_before = False
        while not self.closing:
            try:
                async with asyncio.timeout(self._connect_timeout):
                    if self._netns is None:
                        reader, writer = await asyncio.open_connection(
                            self._host, self._port, limit=1 << 16
                        )
                    else:  # the PrfaaS side of a kernel-shaped link (testbed.transfer.netns)
                        reader, writer = await open_connection_in(
                            self._netns, self._host, self._port, limit=1 << 16
                        )
            except (OSError, TimeoutError) as exc:
                if self.closing:  # the cancel may come as an OSError (uvloop's connect)
                    return
                failures += 1
                out.connect_failures += 1
                reason = f"cannot connect to {self._host}:{self._port}: {exc!r}"
                if failures >= self._reconnect_attempts:
                    self._slot_down[index] = True
                    if all(self._slot_down) and not self.conns:
                        if self.unreachable is None:
                            log.warning("KV receiver unreachable: %s", reason)
                        self.unreachable = reason
                        out.fail_all(reason)
                delay = min(self._backoff * 2 ** min(failures - 1, 16), self._max_backoff)
                await asyncio.sleep(delay)
                continue
            if connected_before:
                out.reconnects += 1
            connected_before = True
            failures = 0
            self._slot_down[index] = False
            self.unreachable = None
            writer.transport.set_write_buffer_limits(high=2 * out.chunk_size)
            conn = Conn(index, reader, writer)
            self.conns.add(conn)
            reason = "connection closed"
            try:
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(self._write_loop(conn))
                    tg.create_task(self._read_loop(conn))
                    tg.create_task(self._watchdog(conn))
            except* Exception as group:
                reason = _describe(group.exceptions)
            finally:
                self.conns.discard(conn)
                writer.close()
            out.on_conn_lost(conn, reason)
            if self.closing:  # the TaskGroup may report a cancel as its children's errors
                return
            await asyncio.sleep(self._backoff)

    async def _write_loop(self, conn: Conn) -> None:
        out = self._outbox
        queue = out.queue
        writer = conn.writer
        algo = self._algo
        chunk_size = out.chunk_size
        while True:
            chunk = await queue.get()
            req = chunk.req
            if chunk.kind is not Kind.ABORT and req.state is not ReqState.OPEN:
                if chunk.kind is Kind.DATA:
                    out.queued -= chunk.size
                continue
            if chunk.kind is Kind.DATA:
                out.queued -= chunk.size
                if out.inflight >= out.max_inflight:
                    try:
                        await out.wait_window()
                    except BaseException:
                        out.queued += chunk.size
                        queue.put_front([chunk])
                        raise
                    if req.state is not ReqState.OPEN:
                        continue
                out.signal_space()
            stamp = time.monotonic_ns()
            frame: DataFrame | EndFrame | AbortFrame
            if chunk.kind is Kind.DATA:
                frame = DataFrame(
                    req.request_id,
                    chunk.layer,
                    chunk.offset,
                    req.layer_sizes[chunk.layer],
                    chunk.data,
                    stamp,
                    algo,
                )
            elif chunk.kind is Kind.END:
                frame = EndFrame(req.request_id, req.layer_sizes, stamp, algo)
            else:
                frame = AbortFrame(
                    req.request_id, req.error.reason if req.error else "", stamp, algo
                )
            head, body = encode_frame(frame)
            if writer.transport.is_closing():  # the receiver went away while we waited
                if chunk.kind is Kind.DATA:
                    out.queued += chunk.size
                queue.put_front([chunk])  # resent on another connection, as any lost one
                raise _ConnectionLost("closed by the receiver")
            if chunk.kind is not Kind.ABORT:
                if not conn.outstanding:
                    conn.last_progress = time.monotonic()
                chunk.conn = conn
                conn.outstanding[chunk] = None
                req.outstanding[chunk.key] = chunk
                out.inflight += chunk.size
                if out.inflight >= out.max_inflight:
                    out.window_open.clear()
            writer.writelines((head, body))
            out.frames_sent += 1
            if chunk.size:
                out.egress.add(chunk.size)
            if writer.transport.get_write_buffer_size() > chunk_size:
                # Only now can drain block; the watchdog bounds how long (io_timeout).
                t0 = time.monotonic()
                conn.drain_since = t0
                await writer.drain()
                conn.drain_since = None
                out.stall_s += time.monotonic() - t0

    async def _read_loop(self, conn: Conn) -> None:
        out = self._outbox
        while True:
            frame = await read_frame(conn.reader)  # deadlines: see _watchdog
            if frame is None:
                raise _ConnectionLost("closed by the receiver")
            if not isinstance(frame, AckFrame):
                raise WireError(f"receiver sent a {type(frame).__name__}, expected ACK")
            out.on_ack(conn, frame)

    async def _watchdog(self, conn: Conn) -> None:
        """Enforce the connection's deadlines with one timer, not two per frame.

        Raising here ends the connection's TaskGroup, which cancels its reader and writer.
        """
        interval = min(0.5, self._ack_timeout / 4, self._io_timeout / 4)
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            if conn.drain_since is not None and now - conn.drain_since > self._io_timeout:
                raise _ConnectionLost(f"socket write blocked for {self._io_timeout:g}s")
            if conn.outstanding and now - conn.last_progress > self._ack_timeout:
                raise _ConnectionLost(f"no ACK for {self._ack_timeout:g}s")


def _describe(errors: Iterable[BaseException]) -> str:
    """A short reason for a lost connection, for TransferError messages."""
    parts = []
    for exc in errors:
        if isinstance(exc, TimeoutError):
            parts.append("write timed out")
        elif isinstance(exc, _ConnectionLost | WireError):
            parts.append(str(exc))
        elif isinstance(exc, OSError):
            parts.append(f"{type(exc).__name__}: {exc.strerror or exc}")
        else:
            log.error("unexpected error on a KV connection", exc_info=exc)
            parts.append(f"{type(exc).__name__}: {exc}")
    return "; ".join(parts) or "connection closed"
