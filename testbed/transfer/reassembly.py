"""Per-request reassembly of KV frames: pure state, no sockets.

Frames of one request arrive over several connections in any order, possibly more than once
(a sender that lost a connection resends what it had not seen acknowledged). This module decides,
frame by frame, what a request's state is and what to answer:

- A request is *complete* only when its END frame has arrived and every byte of every layer it
  announces has arrived in frames whose checksums matched.
- It is *failed*, and never completes, on a checksum mismatch, an inconsistent frame (a layer
  size that disagrees with earlier frames or with END), an ABORT from the sender, or a discard
  by the owner before completion.
- Duplicates are idempotent: per-layer byte ranges count only new bytes, and finished requests
  (even discarded ones, for a while) answer with their final status instead of coming back.

Keeping this apart from the network code makes the rules testable without sockets and lets the
receiver's I/O layer stay a thin, fast loop.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from testbed.transfer.checksum import ChecksumAlgo
from testbed.transfer.errors import TransferError
from testbed.transfer.ranges import RangeSet
from testbed.transfer.wire import (
    AbortFrame,
    AckFrame,
    AckStatus,
    ChecksumMismatch,
    DataFrame,
    EndFrame,
    Frame,
    FrameType,
    MalformedFrame,
)

__all__ = ["KVManifest", "Reassembler"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KVManifest:
    """What arrived for one complete request (times are from the receiver's clock)."""

    request_id: str
    layer_sizes: tuple[int, ...]
    total_bytes: int
    verified: bool  # every frame carried a checksum and it matched
    first_frame_at: float
    last_frame_at: float
    frames: int  # DATA frames accepted, duplicates included
    duplicate_bytes: int  # payload bytes that arrived more than once (retries)

    @property
    def n_layers(self) -> int:
        return len(self.layer_sizes)


class _State(enum.Enum):
    ACTIVE = "active"
    COMPLETE = "complete"
    FAILED = "failed"


class _Layer:
    __slots__ = ("buf", "ranges", "total")

    def __init__(self, total: int, keep_payload: bool) -> None:
        self.total = total
        self.ranges = RangeSet()
        self.buf: bytearray | None = bytearray(total) if keep_payload else None


class _Inbound:
    """Reassembly state of one request."""

    __slots__ = (
        "done",
        "dup_bytes",
        "expected",
        "first_at",
        "frames",
        "last_at",
        "layers",
        "manifest",
        "payload_taken",
        "reason",
        "request_id",
        "sizes",
        "state",
        "unique_bytes",
        "verified",
    )

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.state = _State.ACTIVE
        self.reason = ""
        self.layers: dict[int, _Layer] = {}
        self.sizes: tuple[int, ...] | None = None
        self.expected = -1
        self.unique_bytes = 0
        self.dup_bytes = 0
        self.frames = 0
        self.first_at = float("nan")
        self.last_at = float("nan")
        self.verified = True
        self.manifest: KVManifest | None = None
        self.payload_taken = False
        self.done = asyncio.Event()

    def status(self) -> AckStatus:
        if self.state is _State.COMPLETE:
            return AckStatus.COMPLETE
        if self.state is _State.FAILED:
            return AckStatus.FAILED
        return AckStatus.PROGRESS


class Reassembler:
    """All requests of one receiver. Every method is synchronous except `wait`."""

    def __init__(
        self,
        *,
        keep_payload: bool = False,
        retired_capacity: int = 4096,
        on_complete: Callable[[KVManifest], None] | None = None,
        on_failure: Callable[[str, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.keep_payload = keep_payload
        self._retired_capacity = retired_capacity
        self._on_complete = on_complete
        self._on_failure = on_failure
        self._clock = clock
        self._requests: dict[str, _Inbound] = {}
        self._retired: OrderedDict[str, _Inbound] = OrderedDict()
        self.bytes_received = 0
        self.bytes_duplicate = 0
        self.frames = 0
        self.checksum_failures = 0
        self.completed = 0
        self.failed = 0

    # ---------------------------------------------------------------------------- queries

    @property
    def active(self) -> int:
        return sum(1 for r in self._requests.values() if r.state is _State.ACTIVE)

    def status(self, request_id: str) -> str | None:
        """'active', 'complete', 'failed', or None if unknown."""
        req = self._lookup(request_id)
        return None if req is None else req.state.value

    async def wait(self, request_id: str, timeout: float | None) -> KVManifest:
        """Wait for completion; TransferError on failure, TimeoutError after `timeout` s."""
        req = self._get(request_id)
        async with asyncio.timeout(timeout):
            await req.done.wait()
        if req.manifest is not None:
            return req.manifest
        raise TransferError(request_id, req.reason)

    def discard(self, request_id: str) -> None:
        """Free a request's state and payload. Late duplicates still get its final status."""
        req = self._requests.pop(request_id, None)
        if req is None:
            return
        if req.state is _State.ACTIVE:
            self._fail(req, "discarded by the receiver's owner before completion")
        req.layers.clear()
        self._retired[request_id] = req
        while len(self._retired) > self._retired_capacity:
            self._retired.popitem(last=False)

    def take_payload(self, request_id: str) -> list[bytearray]:
        """Hand over a complete request's bytes, one bytearray per layer (needs keep_payload).

        Ownership moves to the caller: a second call raises KeyError.
        """
        if not self.keep_payload:
            raise RuntimeError("receiver was created with keep_payload=False")
        req = self._requests.get(request_id)
        if req is None or req.state is not _State.COMPLETE or req.sizes is None:
            raise KeyError(f"no complete request {request_id!r} with payload")
        if req.payload_taken:
            raise KeyError(f"payload of {request_id!r} was already taken")
        req.payload_taken = True
        out: list[bytearray] = []
        for i, size in enumerate(req.sizes):
            layer = req.layers.get(i)
            out.append(
                layer.buf if layer is not None and layer.buf is not None else bytearray(size)
            )
        req.layers.clear()
        return out

    # ---------------------------------------------------------------------------- frames

    def on_frame(self, frame: Frame) -> AckFrame | None:
        """Apply one verified frame; returns the ACK to send back (None for ABORT)."""
        self.frames += 1
        if isinstance(frame, DataFrame):
            return self._on_data(frame)
        if isinstance(frame, EndFrame):
            return self._on_end(frame)
        if isinstance(frame, AbortFrame):
            req = self._get(frame.request_id)
            if req.state is _State.ACTIVE:
                self._fail(req, f"aborted by sender: {frame.reason}")
            return None
        # An ACK has no business arriving at a receiver: the peer is confused.
        raise MalformedFrame(f"unexpected {type(frame).__name__} from a sender")

    def on_corrupt(self, exc: ChecksumMismatch) -> AckFrame | None:
        """A frame whose checksum failed: fail its request and tell the sender why."""
        self.frames += 1
        self.checksum_failures += 1
        if exc.request_id is None:
            return None
        h = exc.header
        req = self._get(exc.request_id)
        if req.state is _State.ACTIVE:
            self._fail(req, str(exc))
        if h.type not in (FrameType.DATA, FrameType.END):
            return None
        length = h.body_len if h.type is FrameType.DATA else h.total
        return self._ack(req, h.type, h.layer, h.offset, length, h.stamp_ns)

    def _lookup(self, request_id: str) -> _Inbound | None:
        return self._requests.get(request_id) or self._retired.get(request_id)

    def _get(self, request_id: str) -> _Inbound:
        req = self._lookup(request_id)
        if req is None:
            req = self._requests[request_id] = _Inbound(request_id)
        return req

    def _ack(
        self, req: _Inbound, acked: FrameType, layer: int, offset: int, length: int, stamp: int
    ) -> AckFrame:
        status = req.status()
        detail = req.reason if status is AckStatus.FAILED else ""
        return AckFrame(
            req.request_id, acked, layer, offset, length, status, stamp, detail, ChecksumAlgo.CRC32
        )

    def _touch(self, req: _Inbound) -> None:
        now = self._clock()
        if req.frames == 0:
            req.first_at = now
        req.last_at = now
        req.frames += 1

    def _on_data(self, f: DataFrame) -> AckFrame:
        req = self._get(f.request_id)
        n = len(f.payload)
        ack = (FrameType.DATA, f.layer, f.offset, n, f.stamp_ns)
        if req.state is not _State.ACTIVE:
            self.bytes_duplicate += n
            req.dup_bytes += n
            return self._ack(req, *ack)
        self._touch(req)
        if f.checksum == ChecksumAlgo.NONE:
            req.verified = False
        if req.sizes is not None and (
            f.layer >= len(req.sizes) or req.sizes[f.layer] != f.layer_total
        ):
            self._fail(
                req,
                f"inconsistent frame: layer {f.layer} of size {f.layer_total} does not match "
                f"the END layout of {len(req.sizes)} layers",
            )
            return self._ack(req, *ack)
        layer = req.layers.get(f.layer)
        if layer is None:
            layer = req.layers[f.layer] = _Layer(f.layer_total, self.keep_payload)
        elif layer.total != f.layer_total:
            self._fail(
                req,
                f"inconsistent frame: layer {f.layer} size {f.layer_total}, "
                f"earlier frames said {layer.total}",
            )
            return self._ack(req, *ack)
        new = layer.ranges.add(f.offset, f.offset + n)
        if new and layer.buf is not None:
            layer.buf[f.offset : f.offset + n] = f.payload
        req.unique_bytes += new
        req.dup_bytes += n - new
        self.bytes_received += new
        self.bytes_duplicate += n - new
        self._check_complete(req)
        return self._ack(req, *ack)

    def _on_end(self, f: EndFrame) -> AckFrame:
        req = self._get(f.request_id)
        ack = (FrameType.END, len(f.layer_sizes), 0, f.total_bytes, f.stamp_ns)
        if req.state is not _State.ACTIVE:
            return self._ack(req, *ack)
        if f.checksum == ChecksumAlgo.NONE:
            req.verified = False
        if req.sizes is not None:
            if req.sizes != f.layer_sizes:
                self._fail(req, "inconsistent END: layer layout differs from an earlier END")
            return self._ack(req, *ack)  # a resent END: nothing new
        for index, layer in req.layers.items():
            if index >= len(f.layer_sizes) or f.layer_sizes[index] != layer.total:
                self._fail(
                    req,
                    f"inconsistent END: {len(f.layer_sizes)} layers, but frames of layer "
                    f"{index} said its size is {layer.total}",
                )
                return self._ack(req, *ack)
        req.sizes = f.layer_sizes
        req.expected = f.total_bytes
        if req.frames == 0:
            req.first_at = req.last_at = self._clock()
        self._check_complete(req)
        return self._ack(req, *ack)

    def _check_complete(self, req: _Inbound) -> None:
        if req.sizes is None or req.unique_bytes != req.expected:
            return
        req.state = _State.COMPLETE
        manifest = req.manifest = KVManifest(
            request_id=req.request_id,
            layer_sizes=req.sizes,
            total_bytes=req.expected,
            verified=req.verified,
            first_frame_at=req.first_at,
            last_frame_at=req.last_at,
            frames=req.frames,
            duplicate_bytes=req.dup_bytes,
        )
        self.completed += 1
        req.done.set()
        if self._on_complete is not None:
            try:
                self._on_complete(manifest)
            except Exception:
                log.exception("on_complete callback failed for %s", req.request_id)

    def _fail(self, req: _Inbound, reason: str) -> None:
        req.state = _State.FAILED
        req.reason = reason
        req.layers.clear()  # free payload buffers now: the request can never complete
        self.failed += 1
        req.done.set()
        log.info("KV request %s failed: %s", req.request_id, reason)
        if self._on_failure is not None:
            try:
                self._on_failure(req.request_id, reason)
            except Exception:
                log.exception("on_failure callback failed for %s", req.request_id)
