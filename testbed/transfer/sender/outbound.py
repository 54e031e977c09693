"""Sender-side records: one request's outbound state, each frame it has queued or in flight, and
the connection that carries a frame until its ACK. Plain state: the rules that change it live in
outbox.py (requests and bytes) and slots.py (connections).
"""

from __future__ import annotations

import asyncio
import enum
import math
import time
from dataclasses import dataclass

from testbed.transfer.errors import TransferError
from testbed.transfer.wire import FrameType

__all__ = ["Buffer", "Chunk", "Conn", "Kind", "Outbound", "ReqState", "TransferResult"]

Buffer = bytes | bytearray | memoryview


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


class ReqState(enum.Enum):
    OPEN = "open"
    DONE = "done"
    FAILED = "failed"


class Kind(enum.IntEnum):
    DATA = FrameType.DATA
    END = FrameType.END
    ABORT = FrameType.ABORT


class Chunk:
    """One frame waiting to be sent or waiting for its ACK."""

    __slots__ = ("conn", "data", "kind", "layer", "offset", "req")

    def __init__(self, req: Outbound, kind: Kind, layer: int, offset: int, data: Buffer) -> None:
        self.req = req
        self.kind = kind
        self.layer = layer
        self.offset = offset
        self.data = data
        self.conn: Conn | None = None

    @property
    def key(self) -> tuple[int, int, int]:
        return (int(self.kind), self.layer, self.offset)

    @property
    def size(self) -> int:
        return len(self.data)


class Outbound:
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
        self.outstanding: dict[tuple[int, int, int], Chunk] = {}
        self.state = ReqState.OPEN
        self.error: TransferError | None = None
        self.done = asyncio.Event()
        self.started_at = now
        self.finished_at = math.nan


class Conn:
    """One live connection: its streams and the frames it carries that are not yet ACKed."""

    __slots__ = ("drain_since", "index", "last_progress", "outstanding", "reader", "writer")

    def __init__(
        self, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.index = index
        self.reader = reader
        self.writer = writer
        self.outstanding: dict[Chunk, None] = {}  # insertion-ordered set
        self.last_progress = time.monotonic()
        self.drain_since: float | None = None
