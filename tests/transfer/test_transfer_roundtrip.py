"""Sender -> receiver over loopback: completeness, byte accounting, pipelining, misuse."""

from __future__ import annotations

import asyncio
import math

import pytest

from testbed.transfer import (
    KVManifest,
    KVReceiver,
    KVSender,
    PayloadSource,
    TransferError,
    split_layers,
)


@pytest.fixture(scope="module")
def source() -> PayloadSource:
    return PayloadSource(8 << 20, seed=1)


async def _send(sender: KVSender, source: PayloadSource, rid: str, sizes: tuple[int, ...]) -> None:
    async with sender.open(rid, sizes) as tx:
        for i, n in enumerate(sizes):
            await tx.send_layer(i, source.layer(rid, i, n))
        await tx.finish(timeout=20)


@pytest.mark.parametrize("connections", [1, 4])
async def test_multi_layer_round_trip(
    receiver: KVReceiver, source: PayloadSource, connections: int
) -> None:
    sizes = (300_000, 1, 0, 1_000_000, 65_536, 777_777)
    async with KVSender(
        "127.0.0.1", receiver.port, connections=connections, chunk_size=64 << 10
    ) as sender:
        receiver.expect("req-1", total_bytes=sum(sizes))
        await _send(sender, source, "req-1", sizes)
        manifest = await receiver.wait("req-1", timeout=5)
        stats = sender.stats()
    assert manifest.layer_sizes == sizes
    assert manifest.total_bytes == sum(sizes)
    assert manifest.verified
    assert manifest.duplicate_bytes == 0
    assert manifest.first_frame_at <= manifest.last_frame_at
    assert receiver.stats().bytes_received == stats.bytes_sent == sum(sizes)
    assert stats.bytes_acked == sum(sizes)
    assert stats.inflight_bytes == 0 and stats.queued_bytes == 0
    assert stats.requests_completed == 1 and stats.requests_failed == 0
    assert stats.rtt_samples > 0 and stats.rtt_srtt_s > 0 and not math.isnan(stats.rtt_min_s)
    # the bytes themselves, not only the counts
    got = receiver.take_payload("req-1")
    assert [bytes(b) for b in got] == [bytes(v) for v in source.layers("req-1", sizes)]
    with pytest.raises(KeyError):
        receiver.take_payload("req-1")


async def test_frames_are_striped_over_all_connections(
    receiver: KVReceiver, source: PayloadSource
) -> None:
    async with KVSender("127.0.0.1", receiver.port, connections=4, chunk_size=16 << 10) as s:
        await s.wait_connected(5)
        receiver.expect("wide")
        await _send(s, source, "wide", split_layers(4 << 20, 8))
        assert s.stats().connections_up == 4
    assert receiver.stats().connections_total == 4


async def test_many_concurrent_requests(source: PayloadSource) -> None:
    done: list[KVManifest] = []
    async with (
        KVReceiver(on_complete=done.append) as rx,
        KVSender("127.0.0.1", rx.port, connections=4, chunk_size=32 << 10) as sender,
    ):
        layouts = {f"r{i}": split_layers(50_000 + 7_919 * i, 1 + i % 7) for i in range(40)}
        for rid in layouts:
            rx.expect(rid)
        async with asyncio.TaskGroup() as tg:
            for rid, sizes in layouts.items():
                tg.create_task(_send(sender, source, rid, sizes))
        manifests = [await rx.wait(rid, timeout=5) for rid in layouts]
        assert sorted(m.request_id for m in done) == sorted(layouts)  # each completed once
        total = sum(sum(s) for s in layouts.values())
        assert rx.stats().bytes_received == total == sender.stats().bytes_sent
        assert rx.stats().requests_completed == 40
        assert all(m.total_bytes == sum(layouts[m.request_id]) for m in manifests)
        assert sender.stats().requests_active == 0


async def test_empty_request_completes_on_end_alone(receiver: KVReceiver) -> None:
    receiver.expect("empty")
    async with KVSender("127.0.0.1", receiver.port, connections=1) as sender:
        async with sender.open("empty", (0, 0)) as tx:
            pass  # no layers with bytes: finish() sends just END
        assert tx.result is not None and tx.result.total_bytes == 0
    assert (await receiver.wait("empty", 5)).total_bytes == 0


async def test_layerwise_pipelining(receiver: KVReceiver, source: PayloadSource) -> None:
    """Layer 0 reaches the receiver before the producer has handed over the last layer."""
    sizes = split_layers(2 << 20, 4)
    receiver.expect("pipe")
    async with KVSender("127.0.0.1", receiver.port, connections=2) as sender:
        async with sender.open("pipe", sizes) as tx:
            await tx.send_layer(0, source.layer("pipe", 0, sizes[0]))
            # The producer is still "computing" layers 1..3; layer 0 must already be arriving.
            async with asyncio.timeout(5):
                while receiver.stats().bytes_received < sizes[0]:
                    await asyncio.sleep(0.005)
            assert receiver.status("pipe") == "active"
            for i in range(1, 4):
                await tx.send_layer(i, source.layer("pipe", i, sizes[i]))
        assert (await receiver.wait("pipe", 5)).total_bytes == sum(sizes)


async def test_send_layer_returns_before_bytes_are_sent(
    receiver: KVReceiver, source: PayloadSource
) -> None:
    """Handing over a layer does not wait for the network, so compute overlaps sending."""
    sizes = (4 << 20,)
    receiver.expect("async")
    async with (
        KVSender("127.0.0.1", receiver.port, connections=1) as sender,
        sender.open("async", sizes) as tx,
    ):
        await tx.send_layer(0, source.layer("async", 0, sizes[0]))
        assert sender.stats().bytes_sent < sizes[0]  # queued, not yet written
        assert sender.stats().queued_bytes > 0


async def test_misuse_is_reported(receiver: KVReceiver) -> None:
    receiver.expect("bad")
    async with KVSender("127.0.0.1", receiver.port, connections=1) as sender:
        tx = sender.open("bad", (10, 20))
        with pytest.raises(ValueError, match="already being sent"):
            sender.open("bad", (1,))
        with pytest.raises(ValueError, match="bytes"):
            await tx.send_layer(0, b"short")
        with pytest.raises(ValueError, match="out of range"):
            await tx.send_layer(2, b"x")
        await tx.send_layer(0, b"0123456789")
        with pytest.raises(ValueError, match="already sent"):
            await tx.send_layer(0, b"0123456789")
        with pytest.raises(TransferError, match="before layers"):
            await tx.finish(timeout=5)
        assert sender.stats().requests_failed == 1
    with pytest.raises(TransferError, match="aborted by sender"):
        await receiver.wait("bad", timeout=5)


async def test_exception_in_context_aborts_on_the_receiver(receiver: KVReceiver) -> None:
    failures: list[tuple[str, str]] = []
    async with (
        KVReceiver(on_failure=lambda rid, why: failures.append((rid, why))) as rx,
        KVSender("127.0.0.1", rx.port, connections=1) as sender,
    ):
        rx.expect("crash")
        with pytest.raises(RuntimeError, match="prefill crashed"):
            async with sender.open("crash", (100, 100)) as tx:
                await tx.send_layer(0, b"a" * 100)
                raise RuntimeError("prefill crashed")
        with pytest.raises(TransferError, match="prefill crashed"):
            await rx.wait("crash", timeout=5)
    assert [rid for rid, _ in failures] == ["crash"]


async def test_discard_frees_state_and_late_duplicates_do_not_resurrect(
    receiver: KVReceiver, source: PayloadSource
) -> None:
    receiver.expect("once")
    async with KVSender("127.0.0.1", receiver.port, connections=1) as sender:
        await _send(sender, source, "once", (1000,))
        await receiver.wait("once", 5)
        receiver.discard("once")
        assert receiver.status("once") == "complete"  # remembered as retired
        with pytest.raises(KeyError):
            receiver.take_payload("once")
        # The same id sent again is a duplicate of a finished request: acked, not re-counted.
        await _send(sender, source, "once", (1000,))
    assert receiver.stats().bytes_received == 1000
    assert receiver.stats().requests_completed == 1


def test_round_trip_under_uvloop(source: PayloadSource) -> None:
    """Services run on uvloop when it is installed; its transports differ from asyncio's."""
    uvloop = pytest.importorskip("uvloop")
    sizes = split_layers(3 << 20, 5)

    async def go() -> KVManifest:
        async with (
            KVReceiver(keep_payload=True) as rx,
            KVSender("127.0.0.1", rx.port, connections=4, chunk_size=128 << 10) as sender,
        ):
            rx.expect("uv")
            await _send(sender, source, "uv", sizes)
            manifest = await rx.wait("uv", timeout=5)
            assert [bytes(b) for b in rx.take_payload("uv")] == [
                bytes(v) for v in source.layers("uv", sizes)
            ]
            return manifest

    async def bounded() -> KVManifest:
        async with asyncio.timeout(20):
            return await go()

    assert uvloop.run(bounded()).total_bytes == sum(sizes)


async def test_frames_larger_than_the_receive_buffer(
    receiver: KVReceiver, source: PayloadSource
) -> None:
    """4 MiB frames force the receiver to grow its 64 KiB buffer mid-frame."""
    sizes = (5 << 20, 3 << 20)
    receiver.expect("big")
    async with KVSender("127.0.0.1", receiver.port, connections=2, chunk_size=4 << 20) as s:
        await _send(s, source, "big", sizes)
    await receiver.wait("big", 5)
    assert [bytes(b) for b in receiver.take_payload("big")] == [
        bytes(v) for v in source.layers("big", sizes)
    ]
