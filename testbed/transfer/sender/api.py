"""The public face of a KV sender: `KVSender` (one pool of connections to one receiver),
`KVTransmission` (one request's handle) and `SenderStats`.

The sender wires an Outbox (requests, queue, window, counters) to ConnectionSlots (the
connections) and checks what callers pass in; the behaviour is described in the package
docstring.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType

from testbed.transfer.checksum import ChecksumAlgo, checksum_fn, preferred_algo
from testbed.transfer.errors import TransferError
from testbed.transfer.sender.outbound import Buffer, Outbound, TransferResult
from testbed.transfer.sender.outbox import Outbox
from testbed.transfer.sender.slots import ConnectionSlots
from testbed.transfer.wire import DEFAULT_MAX_PAYLOAD

__all__ = ["KVSender", "KVTransmission", "SenderStats", "pooled_sender"]


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


class KVTransmission:
    """One request's transfer; get it from `KVSender.open` and use it as an async context.

    Leaving the context normally calls `finish()`; leaving it with an exception aborts the
    request (the receiver is told and fails it).
    """

    def __init__(self, outbox: Outbox, req: Outbound) -> None:
        self._outbox = outbox
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
        await self._outbox.send_layer(self._req, layer, data)

    async def finish(self, timeout: float | None = None) -> TransferResult:
        """Send END and wait until the receiver confirms the whole request complete and verified.

        Raises TransferError on failure or after `timeout` (default: the sender's
        request_timeout) seconds, in which case the request is aborted.
        """
        self.result = await self._outbox.finish(self._req, timeout)
        return self.result

    def abort(self, reason: str) -> None:
        """Give up on the request; the receiver is told. No-op once finished."""
        self._outbox.abort(self._req, reason)


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
        netns: open the connections inside this network namespace (the PrfaaS side of a
            kernel-shaped link, testbed.transfer.netns); None: this process's own.
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
        netns: str | None = None,
    ) -> None:
        if connections < 1:
            raise ValueError("need at least one connection")
        if not 1 <= chunk_size <= DEFAULT_MAX_PAYLOAD:
            raise ValueError(f"chunk_size must be 1..{DEFAULT_MAX_PAYLOAD} bytes")
        if max_retries < 0 or reconnect_attempts < 1:
            raise ValueError("max_retries must be >= 0 and reconnect_attempts >= 1")
        self._host, self._port = host, port
        self._n = connections
        self._max_retries = max_retries
        self._algo = preferred_algo() if checksum is None else ChecksumAlgo(checksum)
        checksum_fn(self._algo)  # fail now, not on the first frame, if it cannot be computed
        self._clock = clock
        self._outbox = Outbox(
            chunk_size=chunk_size,
            max_inflight=max(max_inflight_bytes, chunk_size),
            max_queued=max(max_queued_bytes, chunk_size),
            request_timeout=request_timeout,
            clock=clock,
        )
        self._slots = ConnectionSlots(
            self._outbox,
            host,
            port,
            connections,
            algo=self._algo,
            connect_timeout=connect_timeout,
            io_timeout=io_timeout,
            ack_timeout=ack_timeout,
            reconnect_attempts=reconnect_attempts,
            backoff=backoff,
            max_backoff=max_backoff,
            netns=netns,
        )
        self._supervisor: asyncio.Task[None] | None = None

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
        self._supervisor = asyncio.create_task(self._slots.run(), name="kv-sender")
        await asyncio.sleep(0)

    async def aclose(self, flush_timeout: float = 1.0) -> None:
        """Fail whatever is still active, tell the receiver, and close every connection.

        ABORT frames still queued get up to `flush_timeout` seconds to go out, so the decode
        side learns about failures instead of waiting for its own timeout.
        """
        out = self._outbox
        if out.closed:
            return
        for req in list(out.requests.values()):
            out.fail(req, "sender closed")
        out.closed = True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(flush_timeout):
                while len(out.queue) and self._slots.unreachable is None:
                    await asyncio.sleep(0.005)
        if self._supervisor is not None:
            self._slots.closing = True
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor

    async def wait_connected(self, timeout: float) -> None:
        """Wait until every connection is up (mostly for tests and benchmarks)."""
        async with asyncio.timeout(timeout):
            while len(self._slots.conns) < self._n:
                await asyncio.sleep(0.01)

    # ---------------------------------------------------------------------------- public API

    @property
    def unreachable(self) -> str | None:
        """Why the receiver is deemed unreachable (`open()` fails fast), or None."""
        return self._slots.unreachable

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
        out = self._outbox
        if self._supervisor is None or out.closed:
            raise RuntimeError("sender is not running")
        if request_id in out.requests:
            raise ValueError(f"request {request_id!r} is already being sent")
        if not 1 <= len(request_id.encode("utf-8")) <= 64:
            raise ValueError("request id must be 1..64 UTF-8 bytes")
        sizes = tuple(int(s) for s in layer_sizes)
        if any(s < 0 for s in sizes):
            raise ValueError("layer sizes must be >= 0")
        if self._slots.unreachable is not None:
            raise TransferError(request_id, self._slots.unreachable)
        retries = self._max_retries if max_retries is None else max_retries
        req = Outbound(request_id, sizes, retries, self._clock())
        out.requests[request_id] = req
        return KVTransmission(out, req)

    def stats(self) -> SenderStats:
        out = self._outbox
        return SenderStats(
            address=(self._host, self._port),
            connections=self._n,
            connections_up=len(self._slots.conns),
            bytes_sent=out.egress.total,
            bytes_acked=out.acked.total,
            bytes_retransmitted=out.bytes_retransmitted,
            frames_sent=out.frames_sent,
            frames_acked=out.frames_acked,
            inflight_bytes=out.inflight,
            queued_bytes=out.queued,
            egress_rate_ewma=out.egress.ewma(),
            egress_rate_window=out.egress.windowed(),
            ack_rate_ewma=out.acked.ewma(),
            rtt_last_s=out.rtt.last,
            rtt_srtt_s=out.rtt.srtt,
            rtt_min_s=out.rtt.recent_min(),
            rtt_max_s=out.rtt.recent_max(),
            rtt_samples=out.rtt.count,
            stall_s=out.stall_s,
            backpressure_s=out.backpressure_s,
            reconnects=out.reconnects,
            connect_failures=out.connect_failures,
            connection_losses=out.losses,
            retries=out.retries,
            requests_active=len(out.requests),
            requests_completed=out.completed,
            requests_failed=out.failed,
        )


async def pooled_sender(
    senders: dict[tuple[str, int], KVSender],
    target: tuple[str, int],
    connections: int,
    netns: str | None = None,
) -> KVSender:
    """The started sender to `target` from a prefill worker's pool, made on first use.

    A sender whose receiver was found down (a killed decode instance) is replaced: the receiver
    may be back, restarted on the same port, so connect afresh rather than fail fast on the old
    verdict. `netns`: see KVSender."""
    s = senders.get(target)
    if s is not None and s.unreachable is not None:
        del senders[target]
        await s.aclose()
        s = None
    if s is None:
        s = KVSender(target[0], target[1], connections=connections, max_retries=2, netns=netns)
        senders[target] = s
        await s.start()
    return s
