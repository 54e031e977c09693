"""Encoding frames. Fields are range-checked here so a frame that could never be decoded is a
ValueError at the sender, not a WireError at the receiver."""

from __future__ import annotations

import struct
from typing import Final

from testbed.transfer.checksum import ChecksumAlgo, checksum_fn
from testbed.transfer.wire.frames import (
    HEADER_CRC,
    HEADER_PREFIX,
    MAGIC,
    MAX_ID_BYTES,
    MAX_LAYER_BYTES,
    MAX_LAYERS,
    MAX_TEXT_BYTES,
    VERSION,
    AbortFrame,
    AckFrame,
    DataFrame,
    EndFrame,
    Frame,
    FrameType,
)

__all__ = ["encode_frame", "encode_frame_bytes"]

_U32_MAX: Final = 0xFFFF_FFFF
_U64_MAX: Final = 0xFFFF_FFFF_FFFF_FFFF


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
    prefix = HEADER_PREFIX.pack(
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
    return prefix + HEADER_CRC.pack(crc) + rid, body


def encode_frame_bytes(frame: Frame) -> bytes:
    """The whole frame as one bytes object (tests and small control frames)."""
    head, body = encode_frame(frame)
    return head + bytes(body)
