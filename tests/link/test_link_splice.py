"""The kernel path (testbed/link/pipeline/splice.py): a no-toxic direction moving bulk bytes is
handed to a splice thread, and a toxic added afterwards still applies to that connection, with
every byte delivered once and in order."""

from __future__ import annotations

import asyncio

import pytest

from testbed.link.client import LinkClient
from testbed.link.pipeline import ToxicLink
from testbed.link.pipeline.splice import SPLICE_MIN, available
from testbed.link.server import LinkServer

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not available(), reason="os.splice is Linux-only"),
]

PAYLOAD = bytes(range(251)) * 16_000  # ~4 MB, not a multiple of any read or pipe size


def _links(link: LinkServer, name: str) -> list[ToxicLink]:
    return list(link.emulator.get_proxy(name).live_links())


async def _echo_through(
    r: asyncio.StreamReader, w: asyncio.StreamWriter, payload: bytes, piece: int = 256 << 10
) -> bytes:
    """Write `payload` in `piece`-byte writes and read the same number of bytes back."""
    got = bytearray()

    async def send() -> None:
        for i in range(0, len(payload), piece):
            w.write(payload[i : i + piece])
            await w.drain()

    async def recv() -> None:
        while len(got) < len(payload):
            chunk = await r.read(1 << 20)
            assert chunk, "closed early"
            got.extend(chunk)

    await asyncio.wait_for(asyncio.gather(send(), recv()), 30)
    return bytes(got)


async def _rtt(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> float:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    w.write(b"ping")
    await asyncio.wait_for(r.readexactly(4), 5)
    return loop.time() - t0


async def test_bulk_is_spliced_and_a_toxic_added_later_applies(
    link: LinkServer, client: LinkClient, echo: tuple[str, int], addr_of
) -> None:  # type: ignore[no-untyped-def]
    p = await client.create_proxy("bulk", upstream=f"{echo[0]}:{echo[1]}")
    r, w = await asyncio.open_connection(*addr_of(p))
    assert await _echo_through(r, w, PAYLOAD) == PAYLOAD
    spliced = [lk.direction for lk in _links(link, "bulk") if lk.splicer is not None]
    assert spliced, f"no direction went to the kernel path (reads of {SPLICE_MIN}+ bytes)"

    # A toxic added now stops the splice threads before its stage reads a byte.
    await client.add_toxic("bulk", "latency", stream="both", attributes={"latency": 40})
    for _ in range(100):
        if all(lk.splicer is None for lk in _links(link, "bulk")):
            break
        await asyncio.sleep(0.01)
    assert all(lk.splicer is None for lk in _links(link, "bulk"))
    assert await _rtt(r, w) >= 0.078  # 40 ms each way, on the connection that was spliced
    assert await _echo_through(r, w, PAYLOAD[:600_000]) == PAYLOAD[:600_000]

    # Removed again: bulk goes back to the kernel path, bytes still whole and in order.
    await client.remove_toxic("bulk", "latency_both")
    assert await _rtt(r, w) < 0.04
    assert await _echo_through(r, w, PAYLOAD) == PAYLOAD
    w.write_eof()  # the EOF crosses both spliced directions: the echo half-closes back
    assert await asyncio.wait_for(r.read(), 5) == b""
    w.close()


async def test_limit_data_cuts_a_spliced_connection(
    link: LinkServer, client: LinkClient, echo: tuple[str, int], addr_of
) -> None:  # type: ignore[no-untyped-def]
    p = await client.create_proxy("cut", upstream=f"{echo[0]}:{echo[1]}")
    r, w = await asyncio.open_connection(*addr_of(p))
    assert await _echo_through(r, w, PAYLOAD) == PAYLOAD
    await client.add_toxic("cut", "limit_data", stream="downstream", attributes={"bytes": 1000})
    for _ in range(100):
        if all(lk.splicer is None for lk in _links(link, "cut")):
            break
        await asyncio.sleep(0.01)
    w.write(b"z" * 300_000)
    data = b""
    while chunk := await asyncio.wait_for(r.read(65536), 5):
        data += chunk
    assert data == b"z" * 1000
    w.close()


async def test_spliced_bytes_are_counted(
    link: LinkServer, client: LinkClient, echo: tuple[str, int], addr_of
) -> None:  # type: ignore[no-untyped-def]
    p = await client.create_proxy("count", upstream=f"{echo[0]}:{echo[1]}")
    r, w = await asyncio.open_connection(*addr_of(p))
    assert await _echo_through(r, w, PAYLOAD) == PAYLOAD
    w.write_eof()
    assert await asyncio.wait_for(r.read(), 5) == b""
    w.close()
    stats = link.emulator.get_proxy("count").stats
    for _ in range(200):  # the threads report what they moved as they end
        if stats["upstream"].sent == len(PAYLOAD) and stats["downstream"].sent == len(PAYLOAD):
            break
        await asyncio.sleep(0.01)
    for direction in ("upstream", "downstream"):
        assert stats[direction].received == len(PAYLOAD), direction
        assert stats[direction].sent == len(PAYLOAD), direction
