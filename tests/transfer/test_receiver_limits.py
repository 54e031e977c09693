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
    async with KVReceiver(frame_timeout=60) as rx:
        writers = []
        async with _traced() as growth:
            for i in range(10):
                _, w = await asyncio.open_connection("127.0.0.1", rx.port)
                head, _ = encode_frame(DataFrame(f"stall-{i}", 0, 0, 16 * MIB, b"x" * (16 * MIB)))
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
