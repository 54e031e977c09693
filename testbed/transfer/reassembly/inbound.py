"""One expected request on the receiver: its layers, its counters, its state, and the manifest
it ends with. Plain state; the rules that move it from frame to frame live in reassembler.py.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass

from testbed.transfer.checksum import ChecksumAlgo
from testbed.transfer.ranges import RangeSet
from testbed.transfer.wire import AckFrame, AckStatus, FrameType

__all__ = ["NOT_EXPECTED", "Inbound", "KVManifest", "Layer", "State", "refusal"]


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


class State(enum.Enum):
    ACTIVE = "active"
    COMPLETE = "complete"
    FAILED = "failed"


NOT_EXPECTED = "request id not expected by this receiver"
"""The detail of the FAILED ACK that answers a frame for an id nobody announced."""


class Layer:
    """One layer's byte ranges and, when payload is kept, its bytes.

    `buf` holds the contiguous prefix received so far and grows as frames arrive; a chunk beyond
    its end waits in `pending` (by offset) until the gap before it is filled. Senders send a
    layer's chunks in order over a few connections, so `pending` stays small.
    """

    __slots__ = ("buf", "pending", "pending_bytes", "ranges", "total")

    def __init__(self, total: int, keep_payload: bool) -> None:
        self.total = total
        self.ranges = RangeSet()
        self.buf: bytearray | None = bytearray() if keep_payload else None
        self.pending: dict[int, bytes] = {}
        self.pending_bytes = 0

    @property
    def held(self) -> int:
        return (len(self.buf) if self.buf is not None else 0) + self.pending_bytes

    def store(self, offset: int, data: memoryview | bytes | bytearray) -> int:
        """Keep a chunk that brought new bytes; returns the change of bytes held."""
        buf = self.buf
        if buf is None:
            return 0
        before = self.held
        have = len(buf)
        if offset <= have:
            if offset + len(data) > have:
                buf += data[have - offset :]
                self._drain()
        else:
            old = self.pending.get(offset)
            if old is None or len(old) < len(data):
                self.pending[offset] = bytes(data)
                self.pending_bytes += len(data) - (0 if old is None else len(old))
        return self.held - before

    def _drain(self) -> None:
        buf, pending = self.buf, self.pending
        assert buf is not None
        while pending:
            have = len(buf)
            key = have if have in pending else min((k for k in pending if k <= have), default=-1)
            if key < 0:
                return
            chunk = pending.pop(key)
            self.pending_bytes -= len(chunk)
            if key + len(chunk) > have:
                buf += memoryview(chunk)[have - key :]


class Inbound:
    """Reassembly state of one expected request."""

    __slots__ = (
        "announced",
        "deadline",
        "done",
        "dup_bytes",
        "expected",
        "first_at",
        "frames",
        "held",
        "label",
        "last_at",
        "layers",
        "limit",
        "manifest",
        "payload_taken",
        "reason",
        "request_id",
        "sizes",
        "state",
        "unique_bytes",
        "verified",
    )

    def __init__(self, request_id: str, label: str, limit: int | None, deadline: float) -> None:
        self.request_id = request_id
        self.label = label
        self.limit = limit
        self.deadline = deadline
        self.state = State.ACTIVE
        self.reason = ""
        self.layers: dict[int, Layer] = {}
        self.announced = 0  # sum of the sizes of the layers frames announced so far
        self.held = 0  # payload bytes kept for this request
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

    @property
    def name(self) -> str:
        """How logs name the request: the owner's label (the client-visible id) if any."""
        return self.label or self.request_id

    def status(self) -> AckStatus:
        if self.state is State.COMPLETE:
            return AckStatus.COMPLETE
        if self.state is State.FAILED:
            return AckStatus.FAILED
        return AckStatus.PROGRESS

    def ack(self, acked: FrameType, layer: int, offset: int, length: int, stamp: int) -> AckFrame:
        """The ACK of one frame of this request, carrying the request's status now."""
        status = self.status()
        detail = self.reason if status is AckStatus.FAILED else ""
        return AckFrame(
            self.request_id, acked, layer, offset, length, status, stamp, detail, ChecksumAlgo.CRC32
        )


def refusal(
    request_id: str, acked: FrameType, layer: int, offset: int, length: int, stamp: int
) -> AckFrame:
    """The FAILED ACK for a frame whose id nobody expected (no state is created for it)."""
    return AckFrame(
        request_id,
        acked,
        layer,
        offset,
        length,
        AckStatus.FAILED,
        stamp,
        NOT_EXPECTED,
        ChecksumAlgo.CRC32,
    )
