"""The KV wire format: self-describing, checksummed frames over a plain TCP byte stream.

Every frame is a fixed 48-byte big-endian header, then the request id (UTF-8, 1..64 bytes), then a
body whose meaning depends on the frame type:

    off size field     DATA               END                ACK                 ABORT
    0   4    magic     b"PfKV"
    4   1    version   1
    5   1    type      1                  2                  3                   4
    6   1    checksum  ChecksumAlgo id of the `checksum` field below
    7   1    id_len    length of the request id in bytes (1..64)
    8   4    layer     layer index        number of layers   acked layer         0
    12  8    offset    offset in layer    0                  acked offset        0
    20  4    body_len  payload bytes      8 * layers         detail bytes        reason bytes
    24  8    total     bytes of layer     bytes of request   acked length        0
    32  8    stamp     sender clock (ns)  sender clock (ns)  echoed sender stamp sender clock
    40  2    aux       0                  0                  acked type<<8|status 0
    42  2    reserved  0
    44  4    checksum  over header[0:44] + id + body (0 when the algorithm is NONE)
    48  ...  request id, then body (DATA: payload; END: one u64 size per layer; ACK/ABORT: text)

Why these choices:
- String ids (not a fixed 16-byte UUID), 1..64 bytes: the bound limits the header cost and the
  damage a corrupt length can do. The router sends each attempt under a random token
  (capability.py), which only the two ends it picked know; its own request names stay in the
  history.
- The checksum covers the header and id as well as the payload, so a flipped bit in an offset or a
  layer index is caught like one in the payload, not silently written to the wrong place.
- ACK frames echo the sender's own monotonic stamp, so the sender measures RTT (including queueing
  in socket buffers and the link emulator) without per-frame bookkeeping or synchronised clocks.
- The END frame carries every layer size, so the receiver knows exactly when a request is complete
  even though frames of one request arrive over several connections in any order.
- Encoding returns (head, body) separately so the payload is never copied into a frame buffer;
  callers hand both to `StreamWriter.writelines` (uvloop turns that into one writev).

Decoding is strict: anything unexpected raises a `WireError` subclass naming what was wrong, and
lengths are bounded (`max_payload`, 64-byte ids, 65,536 layers, 4 KiB texts) before any read.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Final

from testbed.transfer.checksum import ChecksumAlgo, ChecksumUnavailable, checksum_fn

__all__ = [
    "DEFAULT_MAX_PAYLOAD",
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
    "decode_body",
    "decode_frame",
    "decode_header",
    "encode_frame",
    "encode_frame_bytes",
    "read_frame",
]

MAGIC: Final = b"PfKV"
VERSION: Final = 1
MAX_ID_BYTES: Final = 64
MAX_LAYERS: Final = 65_536
MAX_TEXT_BYTES: Final = 4_096
MAX_LAYER_BYTES: Final = 1 << 40  # 1 TiB: far above any real layer, low enough to catch garbage
DEFAULT_MAX_PAYLOAD: Final = 16 << 20  # 16 MiB per DATA frame

_PREFIX = struct.Struct("!4sBBBBIQIQQHH")  # everything the checksum covers in the header
_CRC = struct.Struct("!I")
HEADER_SIZE: Final = _PREFIX.size + _CRC.size
_U64 = struct.Struct("!Q")
_U32_MAX: Final = 0xFFFF_FFFF
_U64_MAX: Final = 0xFFFF_FFFF_FFFF_FFFF

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


_ACK_STATUSES: Final = frozenset(int(s) for s in AckStatus)


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


# --------------------------------------------------------------------------------------- encode


def _encode_id(request_id: str) -> bytes:
    raw = request_id.encode("utf-8")
    if not 1 <= len(raw) <= MAX_ID_BYTES:
        raise ValueError(f"request id must be 1..{MAX_ID_BYTES} UTF-8 bytes, got {len(raw)}")
    return raw


def _encode_text(text: str) -> bytes:
    raw = text.encode("utf-8", errors="replace")
    if len(raw) > MAX_TEXT_BYTES:
        # Cut on a character boundary so the receiver's strict UTF-8 decode still succeeds.
        raw = raw[:MAX_TEXT_BYTES].decode("utf-8", errors="ignore").encode("utf-8")
    return raw


def _check_range(name: str, value: int, upper: int) -> None:
    if not 0 <= value <= upper:
        raise ValueError(f"{name} must be in 0..{upper}, got {value}")


def encode_frame(frame: Frame) -> tuple[bytes, bytes | bytearray | memoryview]:
    """Encode a frame as (header + id, body). The body is the caller's buffer, not a copy.

    Raises ValueError for frames that could never be decoded (out-of-range fields).
    """
    rid = _encode_id(frame.request_id)
    layer = offset = total = aux = 0
    body: bytes | bytearray | memoryview
    if isinstance(frame, DataFrame):
        ftype = FrameType.DATA
        layer, offset, total, body = frame.layer, frame.offset, frame.layer_total, frame.payload
        _check_range("layer", layer, _U32_MAX)
        _check_range("layer_total", total, MAX_LAYER_BYTES)
        if offset < 0 or offset + len(body) > total:
            raise ValueError(f"chunk [{offset}, +{len(body)}) exceeds layer size {total}")
        if len(body) > _U32_MAX:
            raise ValueError("payload too large for one frame")
    elif isinstance(frame, EndFrame):
        ftype = FrameType.END
        sizes = frame.layer_sizes
        if len(sizes) > MAX_LAYERS:
            raise ValueError(f"at most {MAX_LAYERS} layers, got {len(sizes)}")
        for s in sizes:
            _check_range("layer size", s, MAX_LAYER_BYTES)
        layer, total = len(sizes), sum(sizes)
        body = struct.pack(f"!{len(sizes)}Q", *sizes)
    elif isinstance(frame, AckFrame):
        ftype = FrameType.ACK
        layer, offset, total = frame.layer, frame.offset, frame.length
        _check_range("layer", layer, _U32_MAX)
        _check_range("offset", offset, _U64_MAX)
        _check_range("length", total, _U64_MAX)
        aux = (int(frame.acked) << 8) | int(frame.status)
        body = _encode_text(frame.detail)
    elif isinstance(frame, AbortFrame):
        ftype = FrameType.ABORT
        body = _encode_text(frame.reason)
    else:  # pragma: no cover - guarded by the type checker
        raise TypeError(f"not a frame: {frame!r}")
    _check_range("stamp_ns", frame.stamp_ns, _U64_MAX)
    algo = ChecksumAlgo(frame.checksum)
    prefix = _PREFIX.pack(
        MAGIC,
        VERSION,
        ftype,
        algo,
        len(rid),
        layer,
        offset,
        len(body),
        total,
        frame.stamp_ns,
        aux,
        0,
    )
    crc = 0
    if algo != ChecksumAlgo.NONE:
        fn = checksum_fn(algo)
        crc = fn(body, fn(rid, fn(prefix, 0)))
    return prefix + _CRC.pack(crc) + rid, body


def encode_frame_bytes(frame: Frame) -> bytes:
    """The whole frame as one bytes object (tests and small control frames)."""
    head, body = encode_frame(frame)
    return head + bytes(body)


# --------------------------------------------------------------------------------------- decode


def decode_header(
    buf: bytes | bytearray | memoryview, *, max_payload: int = DEFAULT_MAX_PAYLOAD
) -> Header:
    """Parse and bound-check the fixed header; `buf` must hold at least HEADER_SIZE bytes."""
    if len(buf) < HEADER_SIZE:
        raise TruncatedFrame(f"need {HEADER_SIZE} header bytes, got {len(buf)}")
    prefix = bytes(buf[: _PREFIX.size])
    (magic, version, ftype, algo, id_len, layer, offset, body_len, total, stamp, aux, reserved) = (
        _PREFIX.unpack(prefix)
    )
    (crc,) = _CRC.unpack_from(buf, _PREFIX.size)
    if magic != MAGIC:
        raise MalformedFrame(f"bad magic {magic!r} (expected {MAGIC!r}): not a KV stream")
    if version != VERSION:
        raise MalformedFrame(f"unsupported wire version {version} (this side speaks {VERSION})")
    try:
        frame_type = FrameType(ftype)
    except ValueError:
        raise MalformedFrame(f"unknown frame type {ftype}") from None
    try:
        checksum_algo = ChecksumAlgo(algo)
    except ValueError:
        raise MalformedFrame(f"unknown checksum algorithm {algo}") from None
    if not 1 <= id_len <= MAX_ID_BYTES:
        raise MalformedFrame(f"request id length {id_len} outside 1..{MAX_ID_BYTES}")
    if reserved != 0:
        raise MalformedFrame(f"reserved header field is {reserved}, expected 0")
    if checksum_algo == ChecksumAlgo.NONE and crc != 0:
        raise MalformedFrame("checksum present although the algorithm is NONE")
    if frame_type == FrameType.DATA:
        if body_len > max_payload:
            raise FrameTooLarge(f"DATA payload of {body_len} bytes exceeds limit {max_payload}")
        if total > MAX_LAYER_BYTES:
            raise FrameTooLarge(f"layer size {total} exceeds limit {MAX_LAYER_BYTES}")
        if offset + body_len > total:
            raise MalformedFrame(f"chunk [{offset}, +{body_len}) exceeds layer size {total}")
        if aux != 0:
            raise MalformedFrame("DATA frame with non-zero aux field")
    elif frame_type == FrameType.END:
        if layer > MAX_LAYERS:
            raise FrameTooLarge(f"END announces {layer} layers, limit {MAX_LAYERS}")
        if body_len != 8 * layer:
            raise MalformedFrame(f"END body is {body_len} bytes for {layer} layers")
        if offset != 0 or aux != 0:
            raise MalformedFrame("END frame with non-zero offset/aux field")
    elif frame_type == FrameType.ACK:
        if body_len > MAX_TEXT_BYTES:
            raise FrameTooLarge(f"ACK detail of {body_len} bytes exceeds {MAX_TEXT_BYTES}")
        acked, status = aux >> 8, aux & 0xFF
        if acked not in (FrameType.DATA, FrameType.END) or status not in _ACK_STATUSES:
            raise MalformedFrame(f"ACK with invalid acked type/status field {aux:#06x}")
    else:  # ABORT
        if body_len > MAX_TEXT_BYTES:
            raise FrameTooLarge(f"ABORT reason of {body_len} bytes exceeds {MAX_TEXT_BYTES}")
        if layer != 0 or offset != 0 or total != 0 or aux != 0:
            raise MalformedFrame("ABORT frame with non-zero layer/offset/total/aux field")
    return Header(
        frame_type,
        checksum_algo,
        id_len,
        layer,
        offset,
        body_len,
        total,
        stamp,
        aux,
        crc,
        prefix,
    )


def _decode_text(raw: memoryview, what: str) -> str:
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedFrame(f"{what} is not valid UTF-8: {exc.reason}") from None


def decode_body(header: Header, rest: bytes | bytearray | memoryview) -> Frame:
    """Verify the checksum over header+id+body and build the frame.

    `rest` must be exactly the `header.rest_len` bytes after the header. A DATA frame's payload is
    a memoryview into `rest` (no copy).
    """
    if len(rest) != header.rest_len:
        raise TruncatedFrame(f"frame body is {len(rest)} bytes, header says {header.rest_len}")
    view = memoryview(rest)
    rid_raw = view[: header.id_len]
    body = view[header.id_len :]
    if header.checksum_algo != ChecksumAlgo.NONE:
        try:
            fn = checksum_fn(header.checksum_algo)
        except ChecksumUnavailable as exc:
            raise MalformedFrame(f"cannot verify frame: {exc}") from None
        crc = fn(view, fn(header.prefix, 0))
        if crc != header.checksum:
            try:
                rid: str | None = bytes(rid_raw).decode("utf-8")
            except UnicodeDecodeError:
                rid = None
            raise ChecksumMismatch(
                f"checksum mismatch ({header.checksum_algo.name}) in {header.type.name} frame "
                f"layer {header.layer} offset {header.offset} length {header.body_len}: "
                f"got {crc:#010x}, header says {header.checksum:#010x}",
                header,
                rid,
            )
    request_id = _decode_text(rid_raw, "request id")
    algo = header.checksum_algo
    if header.type == FrameType.DATA:
        return DataFrame(
            request_id, header.layer, header.offset, header.total, body, header.stamp_ns, algo
        )
    if header.type == FrameType.END:
        sizes = struct.unpack(f"!{header.layer}Q", body)
        if any(s > MAX_LAYER_BYTES for s in sizes):
            raise FrameTooLarge(f"END announces a layer above {MAX_LAYER_BYTES} bytes")
        if sum(sizes) != header.total:
            raise MalformedFrame(f"END layer sizes sum to {sum(sizes)}, header says {header.total}")
        return EndFrame(request_id, sizes, header.stamp_ns, algo)
    if header.type == FrameType.ACK:
        return AckFrame(
            request_id,
            FrameType(header.aux >> 8),
            header.layer,
            header.offset,
            header.total,
            AckStatus(header.aux & 0xFF),
            header.stamp_ns,
            _decode_text(body, "ACK detail"),
            algo,
        )
    return AbortFrame(request_id, _decode_text(body, "ABORT reason"), header.stamp_ns, algo)


def decode_frame(
    buf: bytes | bytearray | memoryview, *, max_payload: int = DEFAULT_MAX_PAYLOAD
) -> tuple[Frame, int]:
    """Decode the first frame of `buf`; returns (frame, bytes consumed).

    Raises TruncatedFrame when `buf` ends before the frame does.
    """
    header = decode_header(buf, max_payload=max_payload)
    end = HEADER_SIZE + header.rest_len
    if len(buf) < end:
        raise TruncatedFrame(f"frame needs {end} bytes, only {len(buf)} available")
    return decode_body(header, memoryview(buf)[HEADER_SIZE:end]), end


async def read_frame(
    reader: asyncio.StreamReader,
    *,
    idle_timeout: float | None = None,
    frame_timeout: float | None = None,
    max_payload: int = DEFAULT_MAX_PAYLOAD,
) -> Frame | None:
    """Read one frame from a stream; None on a clean EOF between frames.

    `idle_timeout` bounds the wait for the next header and raises TimeoutError; the stream is
    still in sync afterwards, since `readexactly` consumes nothing until it has everything, so
    callers may simply read again. `frame_timeout` bounds the rest of a frame once its header
    arrived and raises StalledFrame. None means no timer: the hot paths in sender and receiver
    pass None and enforce deadlines with a per-connection watchdog instead, because arming two
    timers per frame cost more CPU than checksumming the payload.
    """
    try:
        if idle_timeout is None:
            raw = await reader.readexactly(HEADER_SIZE)
        else:
            async with asyncio.timeout(idle_timeout):
                raw = await reader.readexactly(HEADER_SIZE)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise TruncatedFrame(f"stream ended inside a header ({len(exc.partial)} bytes)") from None
    header = decode_header(raw, max_payload=max_payload)
    try:
        if frame_timeout is None:
            rest = await reader.readexactly(header.rest_len)
        else:
            async with asyncio.timeout(frame_timeout):
                rest = await reader.readexactly(header.rest_len)
    except TimeoutError:
        raise StalledFrame(
            f"{header.type.name} frame of {header.rest_len} bytes did not arrive "
            f"within {frame_timeout}s"
        ) from None
    except asyncio.IncompleteReadError as exc:
        raise TruncatedFrame(
            f"stream ended inside a {header.type.name} frame "
            f"({len(exc.partial)} of {header.rest_len} bytes)"
        ) from None
    return decode_body(header, rest)
