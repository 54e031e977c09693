"""What one sender's connections and its public API share: the requests, the chunk queue, bytes
queued and in flight (the window), and the counters behind SenderStats.

Every change of a request's state (queued, complete, failed, resent after a lost connection) goes
through here, so the connection loops (slots.py) and the API (api.py) agree on it, and the byte
counts that gate producers (`max_queued`) and writers (`max_inflight`) stay exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from testbed.transfer.errors import TransferError
from testbed.transfer.meter import RateMeter, RttTracker
from testbed.transfer.sender.chunk_queue import ChunkQueue
from testbed.transfer.sender.outbound import (
    Buffer,
    Chunk,
    Conn,
    Kind,
    Outbound,
    ReqState,
    TransferResult,
)
from testbed.transfer.wire import AckFrame, AckStatus

__all__ = ["Outbox"]

log = logging.getLogger(__name__)


class Outbox:
    """The requests of one sender and the bytes they have queued or in flight."""

    def __init__(
        self,
        *,
        chunk_size: int,
        max_inflight: int,
        max_queued: int,
        request_timeout: float,
        clock: Callable[[], float],
    ) -> None:
        self.chunk_size = chunk_size
        self.max_inflight = max_inflight
        self.max_queued = max_queued
        self.request_timeout = request_timeout
        self.clock = clock
        self.closed = False
        """Set by the sender's aclose: no more ABORT frames are queued."""

        self.requests: dict[str, Outbound] = {}
        self.queue = ChunkQueue()
        self.window_open = asyncio.Event()
        self.window_open.set()
        self.queue_space = asyncio.Event()
        self.queue_space.set()

        self.egress = RateMeter(clock=clock)
        self.acked = RateMeter(clock=clock)
        self.rtt = RttTracker()
        self.inflight = 0
        self.queued = 0
        self.bytes_retransmitted = 0
        self.frames_sent = 0
        self.frames_acked = 0
        self.stall_s = 0.0
        self.backpressure_s = 0.0
        self.reconnects = 0
        self.connect_failures = 0
        self.losses = 0
        self.retries = 0
        self.completed = 0
        self.failed = 0

    # ---------------------------------------------------------------------------- producers

    async def send_layer(self, req: Outbound, layer: int, data: Buffer) -> None:
        if req.error is not None:
            raise req.error
        if req.state is not ReqState.OPEN:
            raise RuntimeError(f"request {req.request_id!r} is already finished")
        if not 0 <= layer < len(req.layer_sizes):
            raise ValueError(f"layer {layer} out of range 0..{len(req.layer_sizes) - 1}")
        if layer in req.sent_layers:
            raise ValueError(f"layer {layer} of {req.request_id!r} was already sent")
        view = memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        if len(view) != req.layer_sizes[layer]:
            raise ValueError(
                f"layer {layer} has {len(view)} bytes, the layout says {req.layer_sizes[layer]}"
            )
        req.sent_layers.add(layer)
        step = self.chunk_size
        for off in range(0, len(view), step):
            self.queue.put(Chunk(req, Kind.DATA, layer, off, view[off : off + step]))
        self.queued += len(view)
        if self.queued > self.max_queued:
            self.queue_space.clear()
            t0 = time.perf_counter()
            try:
                while self.queued > self.max_queued and req.state is ReqState.OPEN:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(0.25):
                            await self.queue_space.wait()
            finally:
                self.backpressure_s += time.perf_counter() - t0
        if req.error is not None:
            raise req.error

    async def finish(self, req: Outbound, timeout: float | None) -> TransferResult:
        if req.state is ReqState.OPEN and not req.done.is_set() and req.error is None:
            missing = [i for i in range(len(req.layer_sizes)) if i not in req.sent_layers]
            missing = [i for i in missing if req.layer_sizes[i] > 0]
            if missing:
                self.fail(req, f"finish() before layers {missing[:8]} were sent")
            elif not req.end_queued:
                req.end_queued = True
                self.queue.put(Chunk(req, Kind.END, len(req.layer_sizes), 0, b""))
        limit = self.request_timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(limit):
                await req.done.wait()
        except TimeoutError:
            self.fail(req, f"timed out after {limit:g}s waiting for the receiver to confirm")
        if req.error is not None:
            raise req.error
        return TransferResult(
            request_id=req.request_id,
            total_bytes=sum(req.layer_sizes),
            started_at=req.started_at,
            finished_at=req.finished_at,
            retries=req.retries,
            bytes_retransmitted=req.bytes_retransmitted,
        )

    def abort(self, req: Outbound, reason: str) -> None:
        if req.state is ReqState.OPEN:
            self.fail(req, f"aborted: {reason}")

    # ---------------------------------------------------------------------------- outcomes

    def release(self, req: Outbound) -> None:
        """Forget a finished request's queued and in-flight frames."""
        for chunk in self.queue.purge(req):
            if chunk.kind is Kind.DATA:
                self.queued -= chunk.size
        for chunk in req.outstanding.values():
            if chunk.conn is not None:
                chunk.conn.outstanding.pop(chunk, None)
            self.inflight -= chunk.size
        req.outstanding.clear()
        self.requests.pop(req.request_id, None)
        self.signal_space()

    def complete(self, req: Outbound) -> None:
        req.state = ReqState.DONE
        req.finished_at = self.clock()
        self.completed += 1
        self.release(req)
        req.done.set()

    def fail(self, req: Outbound, reason: str, *, tell_receiver: bool = True) -> None:
        if req.state is not ReqState.OPEN:
            return
        req.state = ReqState.FAILED
        req.finished_at = self.clock()
        req.error = TransferError(req.request_id, reason)
        self.failed += 1
        self.release(req)
        if tell_receiver and not self.closed:
            # Even if none of its frames went out: whoever waits on the receiver learns at once.
            self.queue.put(Chunk(req, Kind.ABORT, 0, 0, b""))
        req.done.set()
        log.info("KV send of %s failed: %s", req.request_id, reason)

    def fail_all(self, reason: str) -> None:
        for req in list(self.requests.values()):
            self.fail(req, reason, tell_receiver=False)

    # ---------------------------------------------------------------------------- the window

    def signal_space(self) -> None:
        if self.inflight < self.max_inflight:
            self.window_open.set()
        if self.queued <= self.max_queued:
            self.queue_space.set()

    async def wait_window(self) -> None:
        t0 = time.perf_counter()
        try:
            while self.inflight >= self.max_inflight:
                self.window_open.clear()
                # Not a network call: ACK timeouts on the connections guarantee progress or
                # failure, which reopens the window. The timeout only re-checks the condition.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await self.window_open.wait()
        finally:
            self.stall_s += time.perf_counter() - t0

    def on_ack(self, conn: Conn, ack: AckFrame) -> None:
        conn.last_progress = time.monotonic()
        req = self.requests.get(ack.request_id)
        if req is None:
            return  # finished or failed already: a late ACK
        chunk = req.outstanding.pop((int(ack.acked), ack.layer, ack.offset), None)
        if chunk is not None:
            if chunk.conn is not None:
                chunk.conn.outstanding.pop(chunk, None)
                chunk.conn = None
            self.inflight -= chunk.size
            self.frames_acked += 1
            if chunk.size:
                self.acked.add(chunk.size)
            self.rtt.add(max(0, time.monotonic_ns() - ack.stamp_ns) / 1e9)
            self.signal_space()
        if ack.status is AckStatus.COMPLETE:
            self.complete(req)
        elif ack.status is AckStatus.FAILED:
            self.fail(req, ack.detail or "failed on the receiver", tell_receiver=False)

    def on_conn_lost(self, conn: Conn, reason: str) -> None:
        """Put a lost connection's unacknowledged frames back at the head of the queue, for
        requests with retries left; fail the others."""
        self.losses += 1
        lost: dict[Outbound, list[Chunk]] = {}
        for chunk in conn.outstanding:
            chunk.conn = None
            self.inflight -= chunk.size
            chunk.req.outstanding.pop(chunk.key, None)
            lost.setdefault(chunk.req, []).append(chunk)
        conn.outstanding.clear()
        if lost:
            log.info(
                "KV connection %d lost (%s) with %d requests in flight",
                conn.index,
                reason,
                len(lost),
            )
        for req, chunks in lost.items():
            if req.state is not ReqState.OPEN:
                continue
            if req.retries_left <= 0:
                unacked = sum(c.size for c in chunks)
                self.fail(
                    req,
                    f"connection lost ({reason}) with {unacked} bytes unacknowledged "
                    f"and no retries left (max_retries={req.retries})"
                    if req.retries
                    else f"connection lost ({reason}) with {unacked} bytes unacknowledged "
                    "and retries disabled",
                )
                continue
            req.retries_left -= 1
            req.retries += 1
            self.retries += 1
            data = [c for c in chunks if c.kind is Kind.DATA]
            resent = sum(c.size for c in data)
            req.bytes_retransmitted += resent
            self.bytes_retransmitted += resent
            self.queued += resent
            self.queue.put_front(chunks)
        self.signal_space()
