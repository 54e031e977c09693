"""What a KV frame is: the layout constants, the four frame types, the parsed header, and the
errors decoding raises. The byte layout itself is documented in the package docstring (wire/).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Final

from testbed.transfer.checksum import ChecksumAlgo

__all__ = [
    "DEFAULT_MAX_PAYLOAD",
    "HEADER_CRC",
    "HEADER_PREFIX",
    "HEADER_SIZE",
    "MAGIC",
    "MAX_ID_BYTES",
    "MAX_LAYERS",
    "MAX_LAYER_BYTES",
    "MAX_TEXT_BYTES",
    "VERSION",
    "AbortFrame",
    "AckFrame",
    "AckStatus",
    "ChecksumMismatch",
    "DataFrame",
    "EndFrame",
    "Frame",
    "FrameTooLarge",
    "FrameType",
    "Header",
    "MalformedFrame",
    "StalledFrame",
    "TruncatedFrame",
    "WireError",
]

MAGIC: Final = b"PfKV"
VERSION: Final = 1
MAX_ID_BYTES: Final = 64
MAX_LAYERS: Final = 65_536
MAX_TEXT_BYTES: Final = 4_096
MAX_LAYER_BYTES: Final = 1 << 40  # 1 TiB: far above any real layer, low enough to catch garbage
DEFAULT_MAX_PAYLOAD: Final = 16 << 20  # 16 MiB per DATA frame

HEADER_PREFIX: Final = struct.Struct("!4sBBBBIQIQQHH")  # the header fields the checksum covers
HEADER_CRC: Final = struct.Struct("!I")
HEADER_SIZE: Final = HEADER_PREFIX.size + HEADER_CRC.size

assert HEADER_SIZE == 48


class FrameType(IntEnum):
    DATA = 1
    END = 2
    ACK = 3
    ABORT = 4


class AckStatus(IntEnum):
    """The receiver's view of the whole request at the moment it acknowledges a frame."""

    PROGRESS = 0  # frame accepted (or a harmless duplicate); request not complete yet
    COMPLETE = 1  # every layer received and verified, END seen
    FAILED = 2  # request failed on the receiver; `detail` says why


class WireError(Exception):
    """Bytes on the wire that are not a valid frame. The only error decoding ever raises."""


class TruncatedFrame(WireError):
    """The input ended inside a frame (or before a full header)."""


class StalledFrame(WireError):
    """A frame started arriving but did not finish within the frame timeout."""


class FrameTooLarge(WireError):
    """A length field exceeds its bound; reading on would trust garbage."""


class MalformedFrame(WireError):
    """A structurally invalid frame: bad magic, version, type, id or inconsistent fields."""


class ChecksumMismatch(WireError):
    """The frame parsed but its checksum does not match: the bytes were corrupted in flight.

    Framing is intact (the lengths were plausible), so a reader may carry on with the next frame;
    the header fields are kept so the receiver can fail the right request.
    """

    def __init__(self, message: str, header: Header, request_id: str | None) -> None:
        super().__init__(message)
        self.header = header
        self.request_id = request_id


@dataclass(frozen=True, slots=True)
class DataFrame:
    """One chunk of one layer's KV bytes."""

    request_id: str
    layer: int
    offset: int
    layer_total: int
    payload: bytes | bytearray | memoryview
    stamp_ns: int = 0
    checksum: ChecksumAlgo = ChecksumAlgo.CRC32


@dataclass(frozen=True, slots=True)
class EndFrame:
    """Sent once per request after its last DATA frame: the full layer layout."""

    request_id: str
    layer_sizes: tuple[int, ...]
    stamp_ns: int = 0
    checksum: ChecksumAlgo = ChecksumAlgo.CRC32

    @property
    def total_bytes(self) -> int:
        return sum(self.layer_sizes)


@dataclass(frozen=True, slots=True)
class AckFrame:
    """Receiver -> sender: one DATA or END frame was processed, and how the request stands."""

    request_id: str
    acked: FrameType
    layer: int
    offset: int
    length: int
    status: AckStatus
    stamp_ns: int = 0  # the acked frame's stamp, echoed
    detail: str = ""
    checksum: ChecksumAlgo = ChecksumAlgo.CRC32


@dataclass(frozen=True, slots=True)
class AbortFrame:
    """Sender -> receiver: the sender gave up on a request; free its state and fail it."""

    request_id: str
    reason: str
    stamp_ns: int = 0
    checksum: ChecksumAlgo = ChecksumAlgo.CRC32


Frame = DataFrame | EndFrame | AckFrame | AbortFrame


@dataclass(frozen=True, slots=True)
class Header:
    """A validated fixed header. `prefix` is kept because the checksum continues over it."""

    type: FrameType
    checksum_algo: ChecksumAlgo
    id_len: int
    layer: int
    offset: int
    body_len: int
    total: int
    stamp_ns: int
    aux: int
    checksum: int
    prefix: bytes = field(repr=False)

    @property
    def rest_len(self) -> int:
        """Bytes that follow the fixed header: id plus body."""
        return self.id_len + self.body_len
