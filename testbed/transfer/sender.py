"""The prefill side of a KV transfer: layer-wise frames striped over persistent TCP connections.

One `KVSender` talks to one receiver address. Whether that address is the link emulator's proxy
port (cross-datacenter) or the decode instance itself (in-cluster) is the caller's decision; the
sender behaves the same either way, which is what lets the testbed compare the two paths.

How it works:
- A prefill hands over each layer as soon as it is computed (`tx.send_layer`). The layer is cut
  into chunks and queued; `send_layer` returns at once (unless more than `max_queued_bytes` wait),
  so computing layer i+1 overlaps with sending layer i (the paper's layer-wise pipelining).
- N connections each run a writer that takes the next chunk from one shared queue, so whichever
  connection drains first sends next: least-loaded striping without a scheduler.
- The receiver ACKs every frame, echoing its send stamp: the sender knows bytes in flight (sent,
  not yet ACKed) and samples RTT, which includes queueing in socket buffers and the emulated link.
  A window (`max_inflight_bytes`) bounds bytes in flight, like a transport's congestion window.
- A request is done when an ACK says the receiver has it complete and verified; `tx.finish()`
  waits for exactly that, so "sent" never means "maybe arrived".
- When a connection dies (reset, EOF, write timeout, or no ACK for `ack_timeout`), its
  unacknowledged frames are put back at the head of the queue if their request still has retries
  (`max_retries`), and the receiver de-duplicates; otherwise those requests fail with a
  TransferError naming the cause. The connection slot reconnects either way.
- If every slot fails to connect `reconnect_attempts` times in a row, the receiver is deemed
  unreachable: active requests fail and `open()` fails fast until a connection succeeds again.

Time to fail against a dead address is bounded by about
reconnect_attempts x (connect_timeout + backoff); a stuck request by `request_timeout`.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType

from testbed.transfer.checksum import ChecksumAlgo, checksum_fn, preferred_algo
from testbed.transfer.errors import TransferError
from testbed.transfer.meter import RateMeter, RttTracker
from testbed.transfer.wire import (
    DEFAULT_MAX_PAYLOAD,
    AbortFrame,
    AckFrame,
    AckStatus,
    DataFrame,
    EndFrame,
    FrameType,
    WireError,
    encode_frame,
    read_frame,
)

__all__ = ["KVSender", "KVTransmission", "SenderStats", "TransferResult", "pooled_sender"]

log = logging.getLogger(__name__)

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class SenderStats:
    """A snapshot for the router and scheduler. Bytes are payload bytes; rates are bytes/s.

    `stall_s` sums, over connections, the time writers held data they could not hand to the
    kernel (socket buffer full, or the in-flight window closed): it grows when the link is the
    bottleneck. `backpressure_s` is time producers waited in `send_layer` on a full queue.
    RTT fields are NaN until the first ACK.
    """

    address: tuple[str, int]
    connections: int
    connections_up: int
    bytes_sent: int
    bytes_acked: int
    bytes_retransmitted: int
    frames_sent: int
    frames_acked: int
    inflight_bytes: int
    queued_bytes: int
    egress_rate_ewma: float
    egress_rate_window: float
    ack_rate_ewma: float
    rtt_last_s: float
    rtt_srtt_s: float
    rtt_min_s: float
    rtt_max_s: float
    rtt_samples: int
    stall_s: float
    backpressure_s: float
    reconnects: int
    connect_failures: int
    connection_losses: int
    retries: int
    requests_active: int
    requests_completed: int
    requests_failed: int


@dataclass(frozen=True, slots=True)
class TransferResult:
    """A request the receiver confirmed complete and verified."""

    request_id: str
    total_bytes: int
    started_at: float
    finished_at: float
    retries: int
    bytes_retransmitted: int

    @property
    def duration_s(self) -> float:
        return self.finished_at - self.started_at


class _ReqState(enum.Enum):
    OPEN = "open"
    DONE = "done"
    FAILED = "failed"


class _Kind(enum.IntEnum):
    DATA = FrameType.DATA
    END = FrameType.END
    ABORT = FrameType.ABORT


class _Chunk:
    """One frame waiting to be sent or waiting for its ACK."""

    __slots__ = ("conn", "data", "kind", "layer", "offset", "req")

    def __init__(self, req: _Outbound, kind: _Kind, layer: int, offset: int, data: Buffer) -> None:
        self.req = req
        self.kind = kind
        self.layer = layer
        self.offset = offset
        self.data = data
        self.conn: _Conn | None = None

    @property
    def key(self) -> tuple[int, int, int]:
        return (int(self.kind), self.layer, self.offset)

    @property
    def size(self) -> int:
        return len(self.data)


class _Outbound:
    """Sender-side state of one request."""

    __slots__ = (
        "bytes_retransmitted",
        "done",
        "end_queued",
        "error",
        "finished_at",
        "layer_sizes",
        "outstanding",
        "request_id",
        "retries",
        "retries_left",
        "sent_layers",
        "started_at",
        "state",
    )

    def __init__(
        self, request_id: str, layer_sizes: tuple[int, ...], retries: int, now: float
    ) -> None:
        self.request_id = request_id
        self.layer_sizes = layer_sizes
        self.retries_left = retries
        self.retries = 0
        self.bytes_retransmitted = 0
        self.sent_layers: set[int] = set()
        self.end_queued = False
        self.outstanding: dict[tuple[int, int, int], _Chunk] = {}
        self.state = _ReqState.OPEN
        self.error: TransferError | None = None
        self.done = asyncio.Event()
        self.started_at = now
        self.finished_at = math.nan


class _Conn:
    """One live connection: its streams and the frames it carries that are not yet ACKed."""

    __slots__ = ("drain_since", "index", "last_progress", "outstanding", "reader", "writer")

    def __init__(
        self, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.index = index
        self.reader = reader
        self.writer = writer
        self.outstanding: dict[_Chunk, None] = {}  # insertion-ordered set
        self.last_progress = time.monotonic()
        self.drain_since: float | None = None


class _ConnectionLost(Exception):
    pass


class _ChunkQueue:
    """FIFO of chunks shared by all writers, with push-to-front for retransmissions."""

    def __init__(self) -> None:
        self._items: deque[_Chunk] = deque()
        self._nonempty = asyncio.Event()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, chunk: _Chunk) -> None:
        self._items.append(chunk)
        self._nonempty.set()

    def put_front(self, chunks: Sequence[_Chunk]) -> None:
        self._items.extendleft(reversed(chunks))
        if chunks:
            self._nonempty.set()

    async def get(self) -> _Chunk:
        while not self._items:
            self._nonempty.clear()
            await self._nonempty.wait()
        return self._items.popleft()

    def purge(self, req: _Outbound) -> list[_Chunk]:
        """Remove and return every queued DATA/END chunk of `req`."""
        kept: deque[_Chunk] = deque()
        removed: list[_Chunk] = []
        for c in self._items:
            (removed if c.req is req and c.kind is not _Kind.ABORT else kept).append(c)
        self._items = kept
        return removed


class KVTransmission:
    """One request's transfer; get it from `KVSender.open` and use it as an async context.

    Leaving the context normally calls `finish()`; leaving it with an exception aborts the
    request (the receiver is told and fails it).
    """

    def __init__(self, sender: KVSender, req: _Outbound) -> None:
        self._sender = sender
        self._req = req
        self.result: TransferResult | None = None

    @property
    def request_id(self) -> str:
        return self._req.request_id

    @property
    def layer_sizes(self) -> tuple[int, ...]:
        return self._req.layer_sizes

    async def __aenter__(self) -> KVTransmission:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            if self.result is None:
                await self.finish()
        else:
            self.abort(f"sender-side {exc_type.__name__}: {exc}")

    async def send_layer(self, layer: int, data: Buffer) -> None:
        """Queue one complete layer (any order, each layer once). Returns once queued.

        `data` must stay unchanged until the transfer finishes (frames are sent and possibly
        resent from it without copying). Raises TransferError if the request already failed.
        """
        await self._sender._send_layer(self._req, layer, data)

    async def finish(self, timeout: float | None = None) -> TransferResult:
        """Send END and wait until the receiver confirms the whole request complete and verified.

        Raises TransferError on failure or after `timeout` (default: the sender's
        request_timeout) seconds, in which case the request is aborted.
        """
        self.result = await self._sender._finish(self._req, timeout)
        return self.result

    def abort(self, reason: str) -> None:
        """Give up on the request; the receiver is told. No-op once finished."""
        self._sender._abort(self._req, reason)


class KVSender:
    """Pool of persistent TCP connections to one KV receiver; use `async with` or start/aclose.

    Args:
        host, port: the receiver, or the link emulator's proxy port in front of it.
        connections: parallel TCP connections (the paper streams over several).
        chunk_size: payload bytes per DATA frame.
        max_inflight_bytes: sent-but-unacknowledged bytes allowed over all connections.
        max_queued_bytes: queued-but-unsent bytes before `send_layer` blocks the producer.
        max_retries: default per request: how many connection losses it may survive by resending
            its unacknowledged frames (0: fail on the first loss).
        connect_timeout: per connection attempt.
        io_timeout: how long a socket write may stay blocked before the connection is dropped.
        ack_timeout: a connection with frames in flight and no ACK for this long is dead.
        request_timeout: default bound for `finish()`.
        reconnect_attempts: consecutive failed connects per slot before it counts as down.
        checksum: frame checksum algorithm (default: fastest available, see checksum.py).
        clock: time source for results and rate meters.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        connections: int = 4,
        chunk_size: int = 256 << 10,
        max_inflight_bytes: int = 32 << 20,
        max_queued_bytes: int = 256 << 20,
        max_retries: int = 0,
        connect_timeout: float = 5.0,
        io_timeout: float = 30.0,
        ack_timeout: float = 30.0,
        request_timeout: float = 120.0,
        reconnect_attempts: int = 3,
        backoff: float = 0.05,
        max_backoff: float = 2.0,
        checksum: ChecksumAlgo | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if connections < 1:
            raise ValueError("need at least one connection")
        if not 1 <= chunk_size <= DEFAULT_MAX_PAYLOAD:
            raise ValueError(f"chunk_size must be 1..{DEFAULT_MAX_PAYLOAD} bytes")
        if max_retries < 0 or reconnect_attempts < 1:
            raise ValueError("max_retries must be >= 0 and reconnect_attempts >= 1")
        self._host, self._port = host, port
        self._n = connections
        self._chunk_size = chunk_size
        self._max_inflight = max(max_inflight_bytes, chunk_size)
        self._max_queued = max(max_queued_bytes, chunk_size)
        self._max_retries = max_retries
        self._connect_timeout = connect_timeout
        self._io_timeout = io_timeout
        self._ack_timeout = ack_timeout
        self._request_timeout = request_timeout
        self._reconnect_attempts = reconnect_attempts
        self._backoff, self._max_backoff = backoff, max_backoff
        self._algo = preferred_algo() if checksum is None else ChecksumAlgo(checksum)
        checksum_fn(self._algo)  # fail now, not on the first frame, if it cannot be computed
        self._clock = clock

        self._requests: dict[str, _Outbound] = {}
        self._queue = _ChunkQueue()
        self._window_open = asyncio.Event()
        self._window_open.set()
        self._queue_space = asyncio.Event()
        self._queue_space.set()
        self._supervisor: asyncio.Task[None] | None = None
        self._conns: set[_Conn] = set()
        self._slot_down = [False] * connections
        self._unreachable: str | None = None
        self._closed = False

        self._egress = RateMeter(clock=clock)
        self._acked = RateMeter(clock=clock)
        self._rtt = RttTracker()
        self._inflight = 0
        self._queued = 0
        self._bytes_retransmitted = 0
        self._frames_sent = 0
        self._frames_acked = 0
        self._stall_s = 0.0
        self._backpressure_s = 0.0
        self._reconnects = 0
        self._connect_failures = 0
        self._losses = 0
        self._retries = 0
        self._completed = 0
        self._failed = 0

    # ---------------------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> KVSender:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Start the connection slots (they connect in the background and keep reconnecting)."""
        if self._supervisor is not None:
            raise RuntimeError("sender already started")
        self._supervisor = asyncio.create_task(self._run(), name="kv-sender")
        await asyncio.sleep(0)

    async def aclose(self, flush_timeout: float = 1.0) -> None:
        """Fail whatever is still active, tell the receiver, and close every connection.

        ABORT frames still queued get up to `flush_timeout` seconds to go out, so the decode
        side learns about failures instead of waiting for its own timeout.
        """
        if self._closed:
            return
        for req in list(self._requests.values()):
            self._fail(req, "sender closed")
        self._closed = True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(flush_timeout):
                while len(self._queue) and self._unreachable is None:
                    await asyncio.sleep(0.005)
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor

    async def _run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            for i in range(self._n):
                tg.create_task(self._slot(i), name=f"kv-sender-slot-{i}")

    async def wait_connected(self, timeout: float) -> None:
        """Wait until every connection is up (mostly for tests and benchmarks)."""
        async with asyncio.timeout(timeout):
            while len(self._conns) < self._n:
                await asyncio.sleep(0.01)

    # ---------------------------------------------------------------------------- public API

    @property
    def unreachable(self) -> str | None:
        """Why the receiver is deemed unreachable (`open()` fails fast), or None."""
        return self._unreachable

    @property
    def address(self) -> tuple[str, int]:
        return self._host, self._port

    @property
    def checksum(self) -> ChecksumAlgo:
        return self._algo

    def open(
        self, request_id: str, layer_sizes: Sequence[int], *, max_retries: int | None = None
    ) -> KVTransmission:
        """Register a request with this layer layout (bytes per layer) and return its handle."""
        if self._supervisor is None or self._closed:
            raise RuntimeError("sender is not running")
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} is already being sent")
        if not 1 <= len(request_id.encode("utf-8")) <= 64:
            raise ValueError("request id must be 1..64 UTF-8 bytes")
        sizes = tuple(int(s) for s in layer_sizes)
        if any(s < 0 for s in sizes):
            raise ValueError("layer sizes must be >= 0")
        if self._unreachable is not None:
            raise TransferError(request_id, self._unreachable)
        retries = self._max_retries if max_retries is None else max_retries
        req = _Outbound(request_id, sizes, retries, self._clock())
        self._requests[request_id] = req
        return KVTransmission(self, req)

    def stats(self) -> SenderStats:
        return SenderStats(
            address=(self._host, self._port),
            connections=self._n,
            connections_up=len(self._conns),
            bytes_sent=self._egress.total,
            bytes_acked=self._acked.total,
            bytes_retransmitted=self._bytes_retransmitted,
            frames_sent=self._frames_sent,
            frames_acked=self._frames_acked,
            inflight_bytes=self._inflight,
            queued_bytes=self._queued,
            egress_rate_ewma=self._egress.ewma(),
            egress_rate_window=self._egress.windowed(),
            ack_rate_ewma=self._acked.ewma(),
            rtt_last_s=self._rtt.last,
            rtt_srtt_s=self._rtt.srtt,
            rtt_min_s=self._rtt.recent_min(),
            rtt_max_s=self._rtt.recent_max(),
            rtt_samples=self._rtt.count,
            stall_s=self._stall_s,
            backpressure_s=self._backpressure_s,
            reconnects=self._reconnects,
            connect_failures=self._connect_failures,
            connection_losses=self._losses,
            retries=self._retries,
            requests_active=len(self._requests),
            requests_completed=self._completed,
            requests_failed=self._failed,
        )

    # ---------------------------------------------------------------------------- requests

    async def _send_layer(self, req: _Outbound, layer: int, data: Buffer) -> None:
        if req.error is not None:
            raise req.error
        if req.state is not _ReqState.OPEN:
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
        step = self._chunk_size
        for off in range(0, len(view), step):
            self._queue.put(_Chunk(req, _Kind.DATA, layer, off, view[off : off + step]))
        self._queued += len(view)
        if self._queued > self._max_queued:
            self._queue_space.clear()
            t0 = time.perf_counter()
            try:
                while self._queued > self._max_queued and req.state is _ReqState.OPEN:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(0.25):
                            await self._queue_space.wait()
            finally:
                self._backpressure_s += time.perf_counter() - t0
        if req.error is not None:
            raise req.error

    async def _finish(self, req: _Outbound, timeout: float | None) -> TransferResult:
        if req.state is _ReqState.OPEN and not req.done.is_set() and req.error is None:
            missing = [i for i in range(len(req.layer_sizes)) if i not in req.sent_layers]
            missing = [i for i in missing if req.layer_sizes[i] > 0]
            if missing:
                self._fail(req, f"finish() before layers {missing[:8]} were sent")
            elif not req.end_queued:
                req.end_queued = True
                self._queue.put(_Chunk(req, _Kind.END, len(req.layer_sizes), 0, b""))
        limit = self._request_timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(limit):
                await req.done.wait()
        except TimeoutError:
            self._fail(req, f"timed out after {limit:g}s waiting for the receiver to confirm")
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

    def _abort(self, req: _Outbound, reason: str) -> None:
        if req.state is _ReqState.OPEN:
            self._fail(req, f"aborted: {reason}")

    def _release(self, req: _Outbound) -> None:
        """Forget a finished request's queued and in-flight frames."""
        for chunk in self._queue.purge(req):
            if chunk.kind is _Kind.DATA:
                self._queued -= chunk.size
        for chunk in req.outstanding.values():
            if chunk.conn is not None:
                chunk.conn.outstanding.pop(chunk, None)
            self._inflight -= chunk.size
        req.outstanding.clear()
        self._requests.pop(req.request_id, None)
        self._signal_space()

    def _complete(self, req: _Outbound) -> None:
        req.state = _ReqState.DONE
        req.finished_at = self._clock()
        self._completed += 1
        self._release(req)
        req.done.set()

    def _fail(self, req: _Outbound, reason: str, *, tell_receiver: bool = True) -> None:
        if req.state is not _ReqState.OPEN:
            return
        req.state = _ReqState.FAILED
        req.finished_at = self._clock()
        req.error = TransferError(req.request_id, reason)
        self._failed += 1
        self._release(req)
        if tell_receiver and not self._closed:
            # Even if none of its frames went out: whoever waits on the receiver learns at once.
            self._queue.put(_Chunk(req, _Kind.ABORT, 0, 0, b""))
        req.done.set()
        log.info("KV send of %s failed: %s", req.request_id, reason)

    def _fail_all(self, reason: str) -> None:
        for req in list(self._requests.values()):
            self._fail(req, reason, tell_receiver=False)

    def _signal_space(self) -> None:
        if self._inflight < self._max_inflight:
            self._window_open.set()
        if self._queued <= self._max_queued:
            self._queue_space.set()

    # ---------------------------------------------------------------------------- connections

    async def _slot(self, index: int) -> None:
        """Keep one connection alive for the sender's lifetime."""
        failures = 0
        connected_before = False
        while True:
            try:
                async with asyncio.timeout(self._connect_timeout):
                    reader, writer = await asyncio.open_connection(
                        self._host, self._port, limit=1 << 16
                    )
            except (OSError, TimeoutError) as exc:
                failures += 1
                self._connect_failures += 1
                reason = f"cannot connect to {self._host}:{self._port}: {exc!r}"
                if failures >= self._reconnect_attempts:
                    self._slot_down[index] = True
                    if all(self._slot_down) and not self._conns:
                        if self._unreachable is None:
                            log.warning("KV receiver unreachable: %s", reason)
                        self._unreachable = reason
                        self._fail_all(reason)
                delay = min(self._backoff * 2 ** min(failures - 1, 16), self._max_backoff)
                await asyncio.sleep(delay)
                continue
            if connected_before:
                self._reconnects += 1
            connected_before = True
            failures = 0
            self._slot_down[index] = False
            self._unreachable = None
            writer.transport.set_write_buffer_limits(high=2 * self._chunk_size)
            conn = _Conn(index, reader, writer)
            self._conns.add(conn)
            reason = "connection closed"
            try:
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(self._write_loop(conn))
                    tg.create_task(self._read_loop(conn))
                    tg.create_task(self._watchdog(conn))
            except* Exception as group:
                reason = _describe(group.exceptions)
            finally:
                self._conns.discard(conn)
                writer.close()
            self._on_conn_lost(conn, reason)
            await asyncio.sleep(self._backoff)

    def _on_conn_lost(self, conn: _Conn, reason: str) -> None:
        self._losses += 1
        lost: dict[_Outbound, list[_Chunk]] = {}
        for chunk in conn.outstanding:
            chunk.conn = None
            self._inflight -= chunk.size
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
            if req.state is not _ReqState.OPEN:
                continue
            if req.retries_left <= 0:
                unacked = sum(c.size for c in chunks)
                self._fail(
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
            self._retries += 1
            data = [c for c in chunks if c.kind is _Kind.DATA]
            resent = sum(c.size for c in data)
            req.bytes_retransmitted += resent
            self._bytes_retransmitted += resent
            self._queued += resent
            self._queue.put_front(chunks)
        self._signal_space()

    async def _write_loop(self, conn: _Conn) -> None:
        writer = conn.writer
        algo = self._algo
        while True:
            chunk = await self._queue.get()
            req = chunk.req
            if chunk.kind is not _Kind.ABORT and req.state is not _ReqState.OPEN:
                if chunk.kind is _Kind.DATA:
                    self._queued -= chunk.size
                continue
            if chunk.kind is _Kind.DATA:
                self._queued -= chunk.size
                if self._inflight >= self._max_inflight:
                    try:
                        await self._wait_window()
                    except BaseException:
                        self._queued += chunk.size
                        self._queue.put_front([chunk])
                        raise
                    if req.state is not _ReqState.OPEN:
                        continue
                self._signal_space()
            stamp = time.monotonic_ns()
            frame: DataFrame | EndFrame | AbortFrame
            if chunk.kind is _Kind.DATA:
                frame = DataFrame(
                    req.request_id,
                    chunk.layer,
                    chunk.offset,
                    req.layer_sizes[chunk.layer],
                    chunk.data,
                    stamp,
                    algo,
                )
            elif chunk.kind is _Kind.END:
                frame = EndFrame(req.request_id, req.layer_sizes, stamp, algo)
            else:
                frame = AbortFrame(
                    req.request_id, req.error.reason if req.error else "", stamp, algo
                )
            head, body = encode_frame(frame)
            if writer.transport.is_closing():  # the receiver went away while we waited
                if chunk.kind is _Kind.DATA:
                    self._queued += chunk.size
                self._queue.put_front([chunk])  # resent on another connection, as any lost one
                raise _ConnectionLost("closed by the receiver")
            if chunk.kind is not _Kind.ABORT:
                if not conn.outstanding:
                    conn.last_progress = time.monotonic()
                chunk.conn = conn
                conn.outstanding[chunk] = None
                req.outstanding[chunk.key] = chunk
                self._inflight += chunk.size
                if self._inflight >= self._max_inflight:
                    self._window_open.clear()
            writer.writelines((head, body))
            self._frames_sent += 1
            if chunk.size:
                self._egress.add(chunk.size)
            if writer.transport.get_write_buffer_size() > self._chunk_size:
                # Only now can drain block; the watchdog bounds how long (io_timeout).
                t0 = time.monotonic()
                conn.drain_since = t0
                await writer.drain()
                conn.drain_since = None
                self._stall_s += time.monotonic() - t0

    async def _wait_window(self) -> None:
        t0 = time.perf_counter()
        try:
            while self._inflight >= self._max_inflight:
                self._window_open.clear()
                # Not a network call: ACK timeouts on the connections guarantee progress or
                # failure, which reopens the window. The timeout only re-checks the condition.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await self._window_open.wait()
        finally:
            self._stall_s += time.perf_counter() - t0

    async def _read_loop(self, conn: _Conn) -> None:
        while True:
            frame = await read_frame(conn.reader)  # deadlines: see _watchdog
            if frame is None:
                raise _ConnectionLost("closed by the receiver")
            if not isinstance(frame, AckFrame):
                raise WireError(f"receiver sent a {type(frame).__name__}, expected ACK")
            self._on_ack(conn, frame)

    async def _watchdog(self, conn: _Conn) -> None:
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

    def _on_ack(self, conn: _Conn, ack: AckFrame) -> None:
        conn.last_progress = time.monotonic()
        req = self._requests.get(ack.request_id)
        if req is None:
            return  # finished or failed already: a late ACK
        chunk = req.outstanding.pop((int(ack.acked), ack.layer, ack.offset), None)
        if chunk is not None:
            if chunk.conn is not None:
                chunk.conn.outstanding.pop(chunk, None)
                chunk.conn = None
            self._inflight -= chunk.size
            self._frames_acked += 1
            if chunk.size:
                self._acked.add(chunk.size)
            self._rtt.add(max(0, time.monotonic_ns() - ack.stamp_ns) / 1e9)
            self._signal_space()
        if ack.status is AckStatus.COMPLETE:
            self._complete(req)
        elif ack.status is AckStatus.FAILED:
            self._fail(req, ack.detail or "failed on the receiver", tell_receiver=False)


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


async def pooled_sender(
    senders: dict[tuple[str, int], KVSender], target: tuple[str, int], connections: int
) -> KVSender:
    """The started sender to `target` from a prefill worker's pool, made on first use.

    A sender whose receiver was found down (a killed decode instance) is replaced: the receiver
    may be back, restarted on the same port, so connect afresh rather than fail fast on the old
    verdict."""
    s = senders.get(target)
    if s is not None and s.unreachable is not None:
        del senders[target]
        await s.aclose()
        s = None
    if s is None:
        s = KVSender(target[0], target[1], connections=connections, max_retries=2)
        senders[target] = s
        await s.start()
    return s
