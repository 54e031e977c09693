"""Toxics and proxy operations on real connections through the in-process emulator."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from testbed.link.client import LinkClient
from testbed.link.server import start_link_server

pytestmark = pytest.mark.timeout(60)


async def _rtt(r: asyncio.StreamReader, w: asyncio.StreamWriter, msg: bytes = b"ping") -> float:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    w.write(msg)
    await asyncio.wait_for(r.readexactly(len(msg)), 5)
    return loop.time() - t0


async def test_latency_on_both_streams(client: LinkClient, echo, addr_of) -> None:  # type: ignore[no-untyped-def]
    p = await client.create_proxy("rtt", upstream=f"{echo[0]}:{echo[1]}")
    r, w = await asyncio.open_connection(*addr_of(p))
    base = await _rtt(r, w)
    t = await client.add_toxic("rtt", "latency", stream="both", attributes={"latency": 40})
    assert t["name"] == "latency_both" and t["stream"] == "both"
    rtt = await _rtt(r, w)  # added to the open connection, both directions
    assert 0.078 <= rtt - base < 0.13, rtt
    await client.update_toxic("rtt", "latency_both", attributes={"latency": 10})
    rtt = await _rtt(r, w)
    assert 0.018 <= rtt < 0.06, rtt
    await client.remove_toxic("rtt", "latency_both")
    assert await _rtt(r, w) < 0.015
    w.close()


async def test_data_integrity_while_toxics_come_and_go(client, echo, addr_of) -> None:  # type: ignore[no-untyped-def]
    p = await client.create_proxy("churn", upstream=f"{echo[0]}:{echo[1]}")
    r, w = await asyncio.open_connection(*addr_of(p))
    payload = bytes(range(251)) * 8000  # ~2 MB, not a multiple of any chunk size
    got = bytearray()

    async def send() -> None:
        for i in range(0, len(payload), 32768):
            w.write(payload[i : i + 32768])
            await w.drain()
            await asyncio.sleep(0.002)
        w.write_eof()

    async def recv() -> None:
        while chunk := await r.read(65536):
            got.extend(chunk)

    async def churn() -> None:
        for i in range(6):
            lat = {"latency": 5, "jitter": 5}
            await client.add_toxic("churn", "latency", name=f"l{i}", stream="both", attributes=lat)
            sl = {"average_size": 500, "size_variation": 100}
            await client.add_toxic("churn", "slicer", name=f"s{i}", attributes=sl)
            await asyncio.sleep(0.03)
            await client.remove_toxic("churn", f"l{i}")
            await client.remove_toxic("churn", f"s{i}")

    await asyncio.wait_for(asyncio.gather(send(), recv(), churn()), 30)
    assert hashlib.sha256(got).digest() == hashlib.sha256(payload).digest()
    w.close()


async def test_timeout_closes_and_limit_data_cuts(client, echo, addr_of) -> None:  # type: ignore[no-untyped-def]
    p = await client.create_proxy("t", upstream=f"{echo[0]}:{echo[1]}")
    await client.add_toxic("t", "timeout", stream="upstream", attributes={"timeout": 100})
    r, w = await asyncio.open_connection(*addr_of(p))
    w.write(b"lost")
    assert await asyncio.wait_for(r.read(), 5) == b""  # closed, nothing echoed
    w.close()
    await client.remove_toxic("t", "timeout_upstream")

    await client.add_toxic("t", "limit_data", attributes={"bytes": 1000})
    r, w = await asyncio.open_connection(*addr_of(p))
    w.write(b"z" * 3000)
    data = await asyncio.wait_for(r.read(), 5)
    while chunk := await asyncio.wait_for(r.read(65536), 5):
        data += chunk
    assert data == b"z" * 1000
    w.close()


async def test_reset_peer_resets(client, echo, addr_of) -> None:  # type: ignore[no-untyped-def]
    p = await client.create_proxy("rst", upstream=f"{echo[0]}:{echo[1]}")
    await client.add_toxic("rst", "reset_peer", stream="upstream", attributes={"timeout": 0})
    r, w = await asyncio.open_connection(*addr_of(p))
    w.write(b"hello")
    with pytest.raises((ConnectionResetError, asyncio.IncompleteReadError)):
        await asyncio.wait_for(r.readexactly(5), 5)
    w.close()


async def test_slow_close_holds_eof(client, echo, addr_of) -> None:  # type: ignore[no-untyped-def]
    p = await client.create_proxy("sc", upstream=f"{echo[0]}:{echo[1]}")
    await client.add_toxic("sc", "slow_close", attributes={"delay": 200})
    r, w = await asyncio.open_connection(*addr_of(p))
    loop = asyncio.get_running_loop()
    w.write(b"bye")
    w.write_eof()
    t0 = loop.time()
    assert await asyncio.wait_for(r.read(), 5) == b"bye"
    assert loop.time() - t0 >= 0.18
    w.close()


async def test_disable_drops_connections_and_enable_relistens(client, echo, addr_of) -> None:  # type: ignore[no-untyped-def]
    p = await client.create_proxy("d", upstream=f"{echo[0]}:{echo[1]}")
    r, w = await asyncio.open_connection(*addr_of(p))
    await client.disable("d")
    assert await asyncio.wait_for(r.read(), 5) == b""
    with pytest.raises(OSError):
        await asyncio.open_connection(*addr_of(p))
    again = await client.enable("d")
    assert again["listen"] == p["listen"]
    r, w = await asyncio.open_connection(*addr_of(again))
    assert await _rtt(r, w) < 1
    w.close()


async def _toxicity_pattern(seed: int, echo: tuple[str, int]) -> list[bool]:
    """Which of 16 sequential connections a 50%-toxicity timeout toxic picked."""
    server = await start_link_server("127.0.0.1", 0, seed=seed)
    async with server, LinkClient(server.url) as c:
        p = await c.create_proxy("tox", upstream=f"{echo[0]}:{echo[1]}")
        await c.add_toxic("tox", "timeout", stream="upstream", toxicity=0.5,
                          attributes={"timeout": 0})  # fmt: skip
        host, port = p["listen"].rsplit(":", 1)
        picked = []
        for _ in range(16):
            r, w = await asyncio.open_connection(host, int(port))
            w.write(b"x")
            try:
                await asyncio.wait_for(r.readexactly(1), 0.15)
                picked.append(False)
            except TimeoutError:
                picked.append(True)
            w.close()
        return picked


async def test_seed_makes_toxicity_reproducible(echo) -> None:  # type: ignore[no-untyped-def]
    a = await _toxicity_pattern(99, echo)
    b = await _toxicity_pattern(99, echo)
    assert a == b
    assert 0 < sum(a) < 16  # toxicity 0.5 really picks some and spares some


async def test_client_surface(client: LinkClient, echo, tmp_path) -> None:  # type: ignore[no-untyped-def]
    up = f"{echo[0]}:{echo[1]}"
    assert (await client.version()).startswith("2.")
    made = await client.populate([{"name": "a", "upstream": up}, {"name": "b", "upstream": up}])
    assert [m["name"] for m in made] == ["a", "b"]
    assert set(await client.proxies()) == {"a", "b"}
    moved = await client.update_proxy("a", upstream=up, listen="127.0.0.1:0")
    assert moved["enabled"] is True
    f = tmp_path / "trace.txt"
    f.write_text("0 100Mbps\n1 10Mbps\n")
    t = await client.add_toxic("a", "link_bandwidth", name="trace",
                               attributes={"schedule_file": str(f), "period": 2})  # fmt: skip
    assert t["attributes"]["schedule_file"] == str(f)
    assert [x["name"] for x in await client.toxics("a")] == ["trace"]
    await client.set_link_bandwidth("b", 1e6)
    await client.set_link_bandwidth("b", 2e6)  # second call updates
    (tox,) = await client.toxics("b")
    assert tox["attributes"]["rate"] == 2000 and tox["stream"] == "both"
    text = await client.metrics()
    for series in (
        'toxiproxy_proxy_sent_bytes_total{direction="upstream"',
        'testbed_link_rate_bytes_per_second{proxy="a",direction="downstream"}',
        'testbed_link_bytes_total{proxy="b",direction="upstream"}',
        'testbed_link_cap_bytes_per_second{proxy="b",direction="downstream"} 2000000.0',
        'testbed_link_connections{proxy="a"} 0',
    ):
        assert series in text
    await client.reset(seed=5)
    assert await client.toxics("a") == [] and await client.toxics("b") == []
    await client.delete_proxy("a")
    assert set(await client.proxies()) == {"b"}
