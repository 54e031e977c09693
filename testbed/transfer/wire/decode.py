"""Decoding frames, strictly: every length is bounded before anything is read or allocated, and
anything unexpected raises a WireError subclass naming what was wrong."""

from __future__ import annotations

import asyncio
import struct
from typing import Final

from testbed.transfer.checksum import ChecksumAlgo, ChecksumUnavailable, checksum_fn
from testbed.transfer.wire.frames import (
    DEFAULT_MAX_PAYLOAD,
    HEADER_CRC,
    HEADER_PREFIX,
    HEADER_SIZE,
    MAGIC,
    MAX_ID_BYTES,
    MAX_LAYER_BYTES,
    MAX_LAYERS,
    MAX_TEXT_BYTES,
    VERSION,
    AbortFrame,
    AckFrame,
    AckStatus,
    ChecksumMismatch,
    DataFrame,
    EndFrame,
    Frame,
    FrameTooLarge,
    FrameType,
    Header,
    MalformedFrame,
    StalledFrame,
    TruncatedFrame,
)

__all__ = ["decode_body", "decode_frame", "decode_header", "read_frame"]

_ACK_STATUSES: Final = frozenset(int(s) for s in AckStatus)
# Plain dict lookups, not Enum(value) calls: a header is decoded per frame, and the Enum
# constructor cost more than the rest of the header checks together.
_FRAME_TYPES: Final = {int(t): t for t in FrameType}
_ALGOS: Final = {int(a): a for a in ChecksumAlgo}


def decode_header(
    buf: bytes | bytearray | memoryview, *, max_payload: int = DEFAULT_MAX_PAYLOAD
) -> Header:
    """Parse and bound-check the fixed header; `buf` must hold at least HEADER_SIZE bytes."""
    if len(buf) < HEADER_SIZE:
        raise TruncatedFrame(f"need {HEADER_SIZE} header bytes, got {len(buf)}")
    prefix = bytes(buf[: HEADER_PREFIX.size])
    (magic, version, ftype, algo, id_len, layer, offset, body_len, total, stamp, aux, reserved) = (
        HEADER_PREFIX.unpack(prefix)
    )
    (crc,) = HEADER_CRC.unpack_from(buf, HEADER_PREFIX.size)
    if magic != MAGIC:
        raise MalformedFrame(f"bad magic {magic!r} (expected {MAGIC!r}): not a KV stream")
    if version != VERSION:
        raise MalformedFrame(f"unsupported wire version {version} (this side speaks {VERSION})")
    frame_type = _FRAME_TYPES.get(ftype)
    if frame_type is None:
        raise MalformedFrame(f"unknown frame type {ftype}")
    checksum_algo = _ALGOS.get(algo)
    if checksum_algo is None:
        raise MalformedFrame(f"unknown checksum algorithm {algo}")
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
