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

The package: frames.py (constants, frame types, the parsed header, errors), encode.py, decode.py.
"""

from __future__ import annotations

from testbed.transfer.wire.decode import decode_body, decode_frame, decode_header, read_frame
from testbed.transfer.wire.encode import encode_frame, encode_frame_bytes
from testbed.transfer.wire.frames import (
    DEFAULT_MAX_PAYLOAD,
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
    WireError,
)

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
