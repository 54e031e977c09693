"""A KV receiver holds memory only for requests it was told to expect, and only as much as the
bytes that really arrived (issue #12 item 11).

Floods from a hostile local process (any process can connect to a decode's KV port): unique ids,
a 1-byte frame that announces a huge layer, headers that promise a big frame and then stall.
Memory is measured with tracemalloc (deterministic allocation accounting of this process) and the
receiver's own counters, never with wall-clock thresholds.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import tracemalloc
from collections.abc import AsyncIterator

import pytest

from testbed.transfer import KVReceiver, KVSender, PayloadSource
from testbed.transfer.wire import (
    AbortFrame,
    AckFrame,
    AckStatus,
    DataFrame,
    EndFrame,
    encode_frame,
    encode_frame_bytes,
    read_frame,
)

MIB = 1 << 20
SOURCE = PayloadSource(4 << 20, seed=3)


@contextlib.asynccontextmanager
async def _traced() -> AsyncIterator[list[int]]:
    """Yields a list that receives the growth of traced memory (bytes) over the block."""
    gc.collect()
    tracemalloc.start()
    out: list[int] = []
    try:
        before = tracemalloc.get_traced_memory()[0]
        yield out
        gc.collect()
        out.append(tracemalloc.get_traced_memory()[0] - before)
    finally:
        tracemalloc.stop()


async def _settle(rounds: int = 40) -> None:
    """Let the receiver's protocol callbacks run (same event loop): a bounded number of turns."""
    for _ in range(rounds):
        await asyncio.sleep(0.005)


async def _read_acks(reader: asyncio.StreamReader, n: int) -> list[AckFrame]:
    acks: list[AckFrame] = []
    async with asyncio.timeout(30):
        while len(acks) < n:
            frame = await read_frame(reader)
            assert isinstance(frame, AckFrame), frame
            acks.append(frame)
    return acks


async def test_frames_for_unexpected_ids_create_no_state() -> None:
    """Flood (a): unique ids never announced to the receiver are refused without state."""
    n = 2000
    async with KVReceiver() as rx:
        reader, writer = await asyncio.open_connection("127.0.0.1", rx.port)
        for i in range(n):
            writer.write(encode_frame_bytes(DataFrame(f"flood-{i}", 0, 0, 1, b"x")))
        writer.write(encode_frame_bytes(EndFrame("flood-end", (1, 2))))
        writer.write(encode_frame_bytes(AbortFrame("flood-abort", "guess")))
        acks = await _read_acks(reader, n + 1)  # no ACK for an ABORT
        writer.close()
        assert {a.status for a in acks} == {AckStatus.FAILED}
        assert all("not expected" in a.detail for a in acks)
        stats = rx.stats()
        assert stats.requests_active == 0
        assert rx.status("flood-0") is None and rx.status("flood-abort") is None


async def test_a_tiny_frame_announcing_a_huge_layer_allocates_nothing() -> None:
    """Flood (b): 1 byte announcing a 256 MiB layer (payload kept, as the torch decode does)."""
    async with KVReceiver(keep_payload=True) as rx:
        _, writer = await asyncio.open_connection("127.0.0.1", rx.port)
        async with _traced() as growth:
            writer.write(encode_frame_bytes(DataFrame("huge", 0, 0, 256 * MIB, b"x")))
            await writer.drain()
            await _settle()
        writer.close()
    assert growth[0] < 4 * MIB, f"traced memory grew by {growth[0] / MIB:.1f} MiB"


async def test_stalled_headers_do_not_pin_what_they_promise() -> None:
    """Flood (c): 10 connections whose headers promise 16 MiB, then stall."""
    promised = b"x" * (16 * MIB)  # only the headers are sent
    heads = [encode_frame(DataFrame(f"stall-{i}", 0, 0, 16 * MIB, promised))[0] for i in range(10)]
    async with KVReceiver(frame_timeout=60) as rx:
        writers = []
        async with _traced() as growth:
            for head in heads:
                _, w = await asyncio.open_connection("127.0.0.1", rx.port)
                w.write(head + b"y" * 1000)
                await w.drain()
                writers.append(w)
            await _settle()
            assert rx.stats().connections_open == 10
        for w in writers:
            w.close()
    assert growth[0] < 4 * MIB, f"traced memory grew by {growth[0] / MIB:.1f} MiB"


@pytest.mark.parametrize("connections", [1, 4])
async def test_an_expected_request_still_round_trips(connections: int) -> None:
    sizes = (300_000, 1, 0, 1_000_000)
    async with KVReceiver(keep_payload=True) as rx:
        rx.expect("ok", total_bytes=sum(sizes))
        async with (
            KVSender("127.0.0.1", rx.port, connections=connections, chunk_size=64 << 10) as tx,
            tx.open("ok", sizes) as t,
        ):
            for i, size in enumerate(sizes):
                await t.send_layer(i, SOURCE.layer("ok", i, size))
        manifest = await rx.wait("ok", 5)
        assert manifest.total_bytes == sum(sizes)
        got = rx.take_payload("ok")
        assert [bytes(b) for b in got] == [bytes(v) for v in SOURCE.layers("ok", sizes)]
        rx.discard("ok")
        assert rx.stats().payload_bytes == 0


async def test_an_expected_request_holds_only_the_bytes_that_arrived() -> None:
    """Flood (b) with a known id: the kept payload grows with the bytes, not the header's size."""
    async with KVReceiver(keep_payload=True) as rx:
        rx.expect("known")
        reader, writer = await asyncio.open_connection("127.0.0.1", rx.port)
        async with _traced() as growth:
            writer.write(encode_frame_bytes(DataFrame("known", 0, 5, 256 * MIB, b"x")))
            writer.write(encode_frame_bytes(DataFrame("known", 0, 0, 256 * MIB, b"y" * 1000)))
            acks = await _read_acks(reader, 2)
        writer.close()
        assert [a.status for a in acks] == [AckStatus.PROGRESS] * 2
        assert rx.stats().payload_bytes <= 1001
        rx.discard("known")
        assert rx.stats().payload_bytes == 0
    assert growth[0] < 4 * MIB


async def test_frames_may_not_announce_more_than_the_expected_size() -> None:
    async with KVReceiver(keep_payload=True) as rx:
        rx.expect("small", total_bytes=1000)
        reader, writer = await asyncio.open_connection("127.0.0.1", rx.port)
        writer.write(encode_frame_bytes(DataFrame("small", 0, 0, 256 * MIB, b"x")))
        (ack,) = await _read_acks(reader, 1)
        writer.close()
        assert ack.status is AckStatus.FAILED and "1000 bytes expected" in ack.detail
        assert rx.status("small") == "failed" and rx.stats().payload_bytes == 0


async def test_corrupt_frames_for_unexpected_ids_create_no_state() -> None:
    async with KVReceiver() as rx:
        raw = bytearray(encode_frame_bytes(DataFrame("nobody", 0, 0, 10, b"0123456789")))
        raw[-1] ^= 0xFF
        reader, writer = await asyncio.open_connection("127.0.0.1", rx.port)
        writer.write(bytes(raw))
        (ack,) = await _read_acks(reader, 1)
        writer.close()
        assert ack.status is AckStatus.FAILED
        stats = rx.stats()
        assert stats.checksum_failures == 1 and stats.frames_refused == 1
        assert stats.requests_tracked == 0 and rx.status("nobody") is None


async def test_expected_requests_past_their_deadline_are_failed_and_freed() -> None:
    now = [0.0]
    async with KVReceiver(keep_payload=True, clock=lambda: now[0], retired_capacity=3) as rx:
        rx.expect("late", ttl=10)
        rx.expect("default")  # no ttl, no default: kept until discarded
        reader, writer = await asyncio.open_connection("127.0.0.1", rx.port)
        writer.write(encode_frame_bytes(DataFrame("late", 0, 0, 100, b"x" * 50)))
        await _read_acks(reader, 1)
        assert rx.stats().payload_bytes == 50
        waiter = asyncio.create_task(rx.wait("late", None))
        now[0] = 10.0
        assert rx.reassembler.expire() == 1
        with pytest.raises(Exception, match="deadline"):
            await waiter
        stats = rx.stats()
        assert stats.requests_tracked == 1 and stats.requests_expired == 1
        assert stats.payload_bytes == 0 and rx.status("late") == "failed"
        # late frames get the final status, without state coming back
        writer.write(encode_frame_bytes(DataFrame("late", 0, 50, 100, b"x" * 50)))
        (ack,) = await _read_acks(reader, 1)
        writer.close()
        assert ack.status is AckStatus.FAILED and rx.stats().payload_bytes == 0
        # retired state is bounded
        for i in range(10):
            rx.expect(f"r{i}")
            rx.discard(f"r{i}")
        assert rx.stats().requests_retired == 3


async def test_expect_refuses_known_ids_and_too_many_requests() -> None:
    from testbed.transfer import ReceiverFull

    async with KVReceiver(max_requests=2) as rx:
        rx.expect("a")
        with pytest.raises(ValueError, match="already known"):
            rx.expect("a")
        rx.expect("b")
        with pytest.raises(ReceiverFull):
            rx.expect("c")
        rx.discard("a")
        with pytest.raises(ValueError, match="already known"):
            rx.expect("a")  # a retired id is not reused
        rx.expect("c")
        with pytest.raises(KeyError):
            await rx.wait("never-announced", 1)


async def test_connections_beyond_the_cap_are_refused() -> None:
    async with KVReceiver(max_connections=3) as rx:
        conns = [await asyncio.open_connection("127.0.0.1", rx.port) for _ in range(6)]
        closed = 0
        for reader, _ in conns:
            with contextlib.suppress(ConnectionError, TimeoutError):
                async with asyncio.timeout(0.5):
                    if await reader.read() == b"":
                        closed += 1
        assert closed == 3
        stats = rx.stats()
        assert stats.connections_open == 3 and stats.connections_refused == 3
        for _, w in conns:
            w.close()


async def test_all_connections_share_one_buffer_budget() -> None:
    """Ten connections each send 2 MiB of a 4 MiB frame: together they hold at most the budget
    plus one overdraft, not 20 MiB; once the frames complete, everyone gets through."""
    budget = 4 * MIB
    payload = b"z" * (4 * MIB)
    async with KVReceiver(max_buffer_bytes=budget, frame_timeout=60) as rx:
        writers = []
        frames = []
        for i in range(10):
            rx.expect(f"b{i}")
            frames.append(encode_frame_bytes(DataFrame(f"b{i}", 0, 0, 4 * MIB, payload)))
        for i in range(10):
            reader, w = await asyncio.open_connection("127.0.0.1", rx.port)
            w.write(frames[i][: 2 * MIB])
            writers.append((reader, w))
        await _settle(100)
        peak = rx.stats().buffer_bytes
        assert peak <= budget + 5 * MIB, peak / MIB
        for i, (_, w) in enumerate(writers):
            w.write(frames[i][2 * MIB :])
        for reader, _ in writers:
            (ack,) = await _read_acks(reader, 1)
            assert ack.status is AckStatus.PROGRESS
        for _, w in writers:
            w.close()
        assert rx.stats().bytes_received == 10 * 4 * MIB


def test_kept_layers_reassemble_out_of_order_and_overlapping_chunks() -> None:
    """Chunks arrive shuffled, duplicated and cut at other offsets (a retry): the kept bytes are
    exact, and what is held never exceeds what arrived."""
    import itertools
    import random

    from testbed.transfer.reassembly import Reassembler

    rng = random.Random(7)
    data = bytes(rng.randrange(256) for _ in range(10_000))
    r = Reassembler(keep_payload=True)
    r.expect("x", total_bytes=len(data))
    cuts = sorted({0, len(data), *(rng.randrange(len(data)) for _ in range(30))})
    chunks = list(itertools.pairwise(cuts))
    chunks += [(a, min(len(data), a + 700)) for a in range(0, len(data), 1500)]  # overlaps
    rng.shuffle(chunks)
    arrived = 0
    for a, b in chunks:
        r.on_frame(DataFrame("x", 0, a, len(data), data[a:b]))
        arrived += b - a
        assert r.payload_bytes <= arrived
    r.on_frame(EndFrame("x", (len(data),)))
    assert r.status("x") == "complete"
    assert r.payload_bytes <= len(data)
    (layer,) = r.take_payload("x")
    assert bytes(layer) == data
    assert r.payload_bytes == 0
