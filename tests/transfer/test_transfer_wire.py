"""Wire format, checksums, byte ranges, payload source and meters: no sockets involved."""

from __future__ import annotations

import asyncio
import contextlib
import math
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testbed.transfer.checksum import ChecksumAlgo, available_algos, checksum_fn
from testbed.transfer.meter import RateMeter, RttTracker
from testbed.transfer.payload import PayloadSource, split_layers
from testbed.transfer.ranges import RangeSet
from testbed.transfer.wire import (
    HEADER_SIZE,
    MAGIC,
    MAX_ID_BYTES,
    VERSION,
    AbortFrame,
    AckFrame,
    AckStatus,
    ChecksumMismatch,
    DataFrame,
    EndFrame,
    FrameTooLarge,
    FrameType,
    MalformedFrame,
    TruncatedFrame,
    WireError,
    decode_frame,
    encode_frame,
    encode_frame_bytes,
    read_frame,
)

ALGOS = available_algos()
REAL_ALGOS = tuple(a for a in ALGOS if a != ChecksumAlgo.NONE)

ids = st.text(min_size=1, max_size=64).filter(lambda s: 1 <= len(s.encode("utf-8")) <= MAX_ID_BYTES)
u32 = st.integers(0, 2**32 - 1)
stamps = st.integers(0, 2**64 - 1)
texts = st.text(max_size=200)


@st.composite
def data_frames(draw: st.DrawFn, algos: tuple[ChecksumAlgo, ...] = ALGOS) -> DataFrame:
    payload = draw(st.binary(max_size=2048))
    offset = draw(st.integers(0, 2**40 - len(payload)))
    total = draw(st.integers(offset + len(payload), 2**40))
    return DataFrame(
        draw(ids), draw(u32), offset, total, payload, draw(stamps), draw(st.sampled_from(algos))
    )


@st.composite
def end_frames(draw: st.DrawFn, algos: tuple[ChecksumAlgo, ...] = ALGOS) -> EndFrame:
    sizes = tuple(draw(st.lists(st.integers(0, 2**40), max_size=300)))
    return EndFrame(draw(ids), sizes, draw(stamps), draw(st.sampled_from(algos)))


@st.composite
def ack_frames(draw: st.DrawFn, algos: tuple[ChecksumAlgo, ...] = ALGOS) -> AckFrame:
    return AckFrame(
        draw(ids),
        draw(st.sampled_from([FrameType.DATA, FrameType.END])),
        draw(u32),
        draw(st.integers(0, 2**64 - 1)),
        draw(st.integers(0, 2**64 - 1)),
        draw(st.sampled_from(list(AckStatus))),
        draw(stamps),
        draw(texts),
        draw(st.sampled_from(algos)),
    )


@st.composite
def abort_frames(draw: st.DrawFn, algos: tuple[ChecksumAlgo, ...] = ALGOS) -> AbortFrame:
    return AbortFrame(draw(ids), draw(texts), draw(stamps), draw(st.sampled_from(algos)))


any_frame = st.one_of(data_frames(), end_frames(), ack_frames(), abort_frames())
checked_frame = st.one_of(
    data_frames(REAL_ALGOS),
    end_frames(REAL_ALGOS),
    ack_frames(REAL_ALGOS),
    abort_frames(REAL_ALGOS),
)


# ------------------------------------------------------------------------------ round trips


@given(any_frame)
def test_every_frame_type_round_trips(frame: DataFrame | EndFrame | AckFrame | AbortFrame) -> None:
    raw = encode_frame_bytes(frame)
    decoded, used = decode_frame(raw)
    assert used == len(raw)
    assert decoded == frame
    assert type(decoded) is type(frame)


@given(st.lists(any_frame, min_size=1, max_size=5))
def test_concatenated_frames_decode_in_order(frames: list) -> None:
    raw = b"".join(encode_frame_bytes(f) for f in frames)
    out = []
    while raw:
        frame, used = decode_frame(raw)
        out.append(frame)
        raw = raw[used:]
    assert out == frames


def test_encode_does_not_copy_the_payload() -> None:
    payload = memoryview(bytearray(b"x" * 1000))
    head, body = encode_frame(DataFrame("r", 0, 0, 1000, payload))
    assert body is payload
    assert len(head) == HEADER_SIZE + 1


@given(st.binary(max_size=3000))
@settings(max_examples=300)
def test_stream_decoding_round_trips_via_read_frame(payload: bytes) -> None:
    frame = DataFrame("req", 3, 0, len(payload) + 5, payload, 42, ChecksumAlgo.CRC32)

    async def go() -> object:
        reader = asyncio.StreamReader()
        reader.feed_data(encode_frame_bytes(frame))
        reader.feed_eof()
        first = await read_frame(reader, idle_timeout=1, frame_timeout=1)
        second = await read_frame(reader, idle_timeout=1, frame_timeout=1)
        return first, second

    first, second = asyncio.run(go())
    assert first == frame
    assert second is None  # clean EOF between frames


# ------------------------------------------------------------------------------ corruption


@given(checked_frame, st.data())
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_any_single_byte_corruption_is_detected(frame: object, data: st.DataObject) -> None:
    raw = bytearray(encode_frame_bytes(frame))  # type: ignore[arg-type]
    pos = data.draw(st.integers(0, len(raw) - 1))
    raw[pos] ^= data.draw(st.integers(1, 255))
    with pytest.raises(WireError):
        decode_frame(bytes(raw))


def test_payload_flip_is_a_checksum_mismatch_naming_the_request() -> None:
    raw = bytearray(encode_frame_bytes(DataFrame("req-7", 2, 512, 4096, b"a" * 100)))
    raw[-10] ^= 1
    with pytest.raises(ChecksumMismatch, match="checksum mismatch") as info:
        decode_frame(bytes(raw))
    assert info.value.request_id == "req-7"
    assert info.value.header.layer == 2


def test_bad_magic_is_reported() -> None:
    raw = b"HTTP" + encode_frame_bytes(AbortFrame("r", "x"))[4:]
    with pytest.raises(MalformedFrame, match="magic"):
        decode_frame(raw)


def test_absurd_payload_length_is_rejected_before_reading_it() -> None:
    head, _ = encode_frame(DataFrame("r", 0, 0, 1 << 30, b"x" * 10))
    raw = bytearray(head)
    raw[20:24] = (1 << 30).to_bytes(4, "big")  # body_len: 1 GiB
    with pytest.raises(FrameTooLarge):
        decode_frame(bytes(raw), max_payload=1 << 20)


def test_truncated_header_and_body() -> None:
    raw = encode_frame_bytes(DataFrame("r", 0, 0, 10, b"x" * 10))
    with pytest.raises(TruncatedFrame):
        decode_frame(raw[: HEADER_SIZE - 1])
    with pytest.raises(TruncatedFrame):
        decode_frame(raw[:-1])


def test_unencodable_frames_are_value_errors() -> None:
    with pytest.raises(ValueError):
        encode_frame(DataFrame("", 0, 0, 1, b"x"))
    with pytest.raises(ValueError):
        encode_frame(DataFrame("r" * 65, 0, 0, 1, b"x"))
    with pytest.raises(ValueError):
        encode_frame(DataFrame("r", 0, 5, 8, b"xxxx"))  # past the end of the layer


# ------------------------------------------------------------------------------ garbage


@given(st.binary(max_size=400))
@settings(max_examples=500)
def test_garbage_raises_only_wire_errors(raw: bytes) -> None:
    with contextlib.suppress(WireError):
        decode_frame(raw)


@given(st.sampled_from([1, 2, 3, 4, 9]), st.binary(max_size=400))
@settings(max_examples=500)
def test_garbage_behind_a_valid_magic_raises_only_wire_errors(ftype: int, rest: bytes) -> None:
    with contextlib.suppress(WireError):
        decode_frame(MAGIC + bytes([VERSION, ftype]) + rest)


@given(st.binary(max_size=600))
@settings(max_examples=200)
def test_stream_garbage_never_hangs_and_raises_only_wire_errors(raw: bytes) -> None:
    async def go() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(raw)
        reader.feed_eof()
        async with asyncio.timeout(2):  # EOF is fed, so a hang would be a bug
            while await read_frame(reader, idle_timeout=1, frame_timeout=1) is not None:
                pass

    with contextlib.suppress(WireError):
        asyncio.run(go())


# ------------------------------------------------------------------------------ checksums


def test_checksum_known_vectors() -> None:
    assert checksum_fn(ChecksumAlgo.CRC32)(b"123456789", 0) == zlib.crc32(b"123456789")
    if ChecksumAlgo.CRC32C in ALGOS:
        assert checksum_fn(ChecksumAlgo.CRC32C)(b"123456789", 0) == 0xE3069283
        # incremental use is what lets a frame checksum cover header, id and payload
        fn = checksum_fn(ChecksumAlgo.CRC32C)
        assert fn(b"6789", fn(b"12345", 0)) == 0xE3069283


# ------------------------------------------------------------------------------ ranges


@given(st.lists(st.tuples(st.integers(0, 300), st.integers(0, 60)), max_size=40))
def test_rangeset_matches_a_set_model(spans: list[tuple[int, int]]) -> None:
    rs = RangeSet()
    model: set[int] = set()
    for start, length in spans:
        new = set(range(start, start + length)) - model
        assert rs.add(start, start + length) == len(new)
        model |= new
        assert rs.covered == len(model)
        assert rs.contains(start, start + length)
    flat = rs.ranges()
    assert all(a < b for a, b in flat)
    assert all(flat[i][1] < flat[i + 1][0] for i in range(len(flat) - 1))  # disjoint, merged
    assert sum(b - a for a, b in flat) == len(model)


# ------------------------------------------------------------------------------ payload, meters


def test_payload_source_is_deterministic_and_zero_copy() -> None:
    a, b = PayloadSource(1 << 20, seed=7), PayloadSource(1 << 20, seed=7)
    x = a.layer("req", 3, 4096)
    assert isinstance(x, memoryview)
    assert x.obj is a.layer("other", 1, 10).obj  # slices of one buffer
    assert bytes(x) == bytes(b.layer("req", 3, 4096))
    assert bytes(x) != bytes(a.layer("req", 4, 4096))
    with pytest.raises(ValueError, match="larger"):
        a.layer("req", 0, (1 << 20) + 1)


@given(st.integers(0, 10**9), st.integers(1, 200))
def test_split_layers(total: int, n: int) -> None:
    sizes = split_layers(total, n)
    assert len(sizes) == n and sum(sizes) == total and max(sizes) - min(sizes) <= 1


def test_rate_meter_with_fake_clock() -> None:
    now = [0.0]
    m = RateMeter(tau=1.0, window=1.0, tick=0.05, clock=lambda: now[0])
    for _ in range(200):  # 100 MB/s for 2 s, in 10 ms steps
        now[0] += 0.01
        m.add(1_000_000)
    assert m.windowed() == pytest.approx(100e6, rel=0.05)
    assert m.ewma() == pytest.approx(100e6, rel=0.2)
    now[0] += 10.0
    assert m.windowed() == 0.0
    assert m.ewma() < 1e6  # decays when idle
    assert m.total == 200_000_000


def test_rtt_tracker() -> None:
    t = RttTracker()
    assert math.isnan(t.srtt) and math.isnan(t.recent_min())
    for v in (0.010, 0.020, 0.030):
        t.add(v)
    assert t.count == 3 and t.last == 0.030
    assert t.recent_min() == 0.010 and t.recent_max() == 0.030
    assert 0.010 < t.srtt < 0.030
