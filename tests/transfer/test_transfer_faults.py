"""Faults on the KV path: corruption, resets, dead and silent peers, stalls, garbage, timeouts."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from testbed.transfer import (
    KVManifest,
    KVReceiver,
    KVSender,
    PayloadSource,
    TransferError,
    split_layers,
)
from testbed.transfer.wire import HEADER_SIZE, DataFrame, encode_frame

# The fault proxy lives in conftest.py (fixture `make_proxy`); tests/ is not a package.
ProxyFactory = Callable[..., Awaitable[Any]]

SOURCE = PayloadSource(4 << 20, seed=2)


async def _send(sender: KVSender, rid: str, sizes: tuple[int, ...], timeout: float = 20) -> None:
    async with sender.open(rid, sizes) as tx:
        for i, n in enumerate(sizes):
            await tx.send_layer(i, SOURCE.layer(rid, i, n))
        await tx.finish(timeout=timeout)


def _dead_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_flipped_payload_byte_fails_the_request_with_a_checksum_reason(
    make_proxy: ProxyFactory,
) -> None:
    completed: list[KVManifest] = []
    async with KVReceiver(on_complete=completed.append) as rx:
        rid = "corrupt-me"
        rx.expect(rid)
        # Byte 100 of the first frame's payload, on the only connection.
        proxy = await make_proxy(rx.port, flip_at=HEADER_SIZE + len(rid) + 100)
        async with KVSender("127.0.0.1", proxy.port, connections=1, max_retries=3) as sender:
            with pytest.raises(TransferError, match="checksum") as sent:
                await _send(sender, rid, (200_000, 200_000), timeout=10)
        assert sent.value.request_id == rid
        with pytest.raises(TransferError, match="checksum mismatch"):
            await rx.wait(rid, timeout=5)
        assert proxy.flips_done == 1
        assert rx.status(rid) == "failed"
        assert rx.stats().checksum_failures == 1
        assert rx.stats().requests_completed == 0 and completed == []


async def test_checksum_off_is_reported_as_unverified(receiver: KVReceiver) -> None:
    from testbed.transfer import ChecksumAlgo

    receiver.expect("plain")
    async with KVSender(
        "127.0.0.1", receiver.port, connections=1, checksum=ChecksumAlgo.NONE
    ) as sender:
        await _send(sender, "plain", (1000,))
    assert (await receiver.wait("plain", 5)).verified is False


@pytest.mark.parametrize("connections", [1, 4])
async def test_reset_mid_transfer_with_retries_completes_exactly_once(
    make_proxy: ProxyFactory, connections: int
) -> None:
    completed: list[KVManifest] = []
    sizes = split_layers(3 << 20, 6)
    async with KVReceiver(on_complete=completed.append) as rx:
        rx.expect("survivor")
        proxy = await make_proxy(rx.port, reset_after=700_000)
        async with KVSender(
            "127.0.0.1",
            proxy.port,
            connections=connections,
            chunk_size=64 << 10,
            max_retries=2,
            backoff=0.01,
        ) as sender:
            await _send(sender, "survivor", sizes)
            # With several connections the request can finish on the others before the lost
            # slot has reconnected (it backs off first); wait for it, bounded.
            for _ in range(100):
                if sender.stats().reconnects >= 1:
                    break
                await asyncio.sleep(0.05)
            stats = sender.stats()
        manifest = await rx.wait("survivor", timeout=5)
    assert proxy.resets_done == 1
    assert [m.request_id for m in completed] == ["survivor"]
    assert manifest.total_bytes == sum(sizes)
    assert rx.stats().bytes_received == sum(sizes)  # duplicates are not counted twice
    assert stats.connection_losses >= 1 and stats.reconnects >= 1 and stats.retries == 1
    assert stats.bytes_sent == sum(sizes) + stats.bytes_retransmitted
    assert stats.inflight_bytes == 0


async def test_reset_mid_transfer_without_retries_fails_with_a_reason(
    make_proxy: ProxyFactory,
) -> None:
    async with KVReceiver() as rx:
        rx.expect("victim")
        rx.expect("next")
        proxy = await make_proxy(rx.port, reset_after=300_000)
        async with KVSender(
            "127.0.0.1", proxy.port, connections=1, max_retries=0, backoff=0.01
        ) as sender:
            with pytest.raises(TransferError, match=r"connection lost.*retries disabled"):
                await _send(sender, "victim", split_layers(2 << 20, 4))
            # The slot reconnected: the next request goes through.
            await _send(sender, "next", (50_000,))
        # The receiver is told, so nothing waits for ever on the decode side.
        with pytest.raises(TransferError, match="aborted by sender"):
            await rx.wait("victim", timeout=5)
        assert (await rx.wait("next", timeout=5)).total_bytes == 50_000
    assert rx.stats().requests_completed == 1


async def test_retries_are_bounded(make_proxy: ProxyFactory) -> None:
    async with KVReceiver() as rx:
        rx.expect("doomed")
        proxy = await make_proxy(rx.port, reset_after=100_000, resets=10)
        async with KVSender(
            "127.0.0.1", proxy.port, connections=1, max_retries=2, backoff=0.01
        ) as sender:
            with pytest.raises(TransferError, match="no retries left"):
                await _send(sender, "doomed", split_layers(1 << 20, 2))
            assert sender.stats().retries == 2
    assert proxy.resets_done == 3


async def test_receiver_wait_times_out_cleanly(receiver: KVReceiver) -> None:
    receiver.expect("never-sent")
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        await receiver.wait("never-sent", timeout=0.2)
    assert 0.15 < time.monotonic() - t0 < 2.0
    assert receiver.status("never-sent") == "active"
    receiver.discard("never-sent")
    assert receiver.status("never-sent") == "failed"


async def test_sender_to_a_dead_address_fails_within_its_timeout() -> None:
    port = _dead_port()
    t0 = time.monotonic()
    async with KVSender(
        "127.0.0.1", port, connections=2, connect_timeout=0.5, reconnect_attempts=2, backoff=0.05
    ) as sender:
        with pytest.raises(TransferError, match="cannot connect"):
            await _send(sender, "lost", (1000,), timeout=10)
        assert time.monotonic() - t0 < 3.0
        # While unreachable, new requests fail fast instead of queueing.
        with pytest.raises(TransferError, match="cannot connect"):
            sender.open("later", (1,))
        assert sender.stats().connect_failures >= 4


async def test_silent_receiver_trips_the_ack_timeout() -> None:
    """A peer that accepts but never ACKs (a black-holed link) is detected, not waited on."""
    held: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # keep it open, read nothing, answer nothing

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        t0 = time.monotonic()
        async with KVSender(
            "127.0.0.1", port, connections=1, ack_timeout=0.5, max_retries=0
        ) as sender:
            with pytest.raises(TransferError, match="no ACK"):
                await _send(sender, "unheard", (10_000,), timeout=10)
        assert time.monotonic() - t0 < 5.0
    finally:
        for w in held:
            w.transport.abort()
        server.close()
        await server.wait_closed()


async def test_finish_timeout_is_a_transfer_error() -> None:
    held: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    try:
        async with KVSender("127.0.0.1", server.sockets[0].getsockname()[1]) as sender:
            with pytest.raises(TransferError, match="timed out"):
                await _send(sender, "slow", (1000,), timeout=0.3)
    finally:
        for w in held:
            w.transport.abort()
        server.close()
        await server.wait_closed()


async def test_receiver_drops_a_stalled_frame_and_garbage_but_keeps_serving() -> None:
    async with KVReceiver(frame_timeout=0.3, check_interval=0.05) as rx:
        # 1. A header promising a payload that never comes.
        head, _ = encode_frame(DataFrame("stall", 0, 0, 100_000, b"x" * 100_000))
        r1, w1 = await asyncio.open_connection("127.0.0.1", rx.port)
        w1.write(head)
        async with asyncio.timeout(5):
            assert await r1.read() == b""  # closed by the receiver's watchdog
        assert rx.stats().timeouts == 1
        # 2. Garbage.
        r2, w2 = await asyncio.open_connection("127.0.0.1", rx.port)
        w2.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\0" * 64)
        async with asyncio.timeout(5):
            assert await r2.read() == b""
        assert rx.stats().protocol_errors == 1
        for w in (w1, w2):
            w.close()
        # 3. Still serving.
        rx.expect("fine")
        async with KVSender("127.0.0.1", rx.port, connections=1) as sender:
            await _send(sender, "fine", (5000,))
        assert (await rx.wait("fine", 5)).total_bytes == 5000


async def test_idle_connections_are_closed_and_senders_reconnect() -> None:
    async with (
        KVReceiver(idle_timeout=0.2, check_interval=0.05) as rx,
        KVSender("127.0.0.1", rx.port, connections=1, backoff=0.01) as sender,
    ):
        rx.expect("a")
        rx.expect("b")
        await _send(sender, "a", (1000,))
        await asyncio.sleep(0.6)
        await _send(sender, "b", (1000,))
        assert sender.stats().reconnects >= 1
        assert sender.stats().requests_failed == 0
