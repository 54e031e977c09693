"""Shaping through real sockets on 127.0.0.1: the shared link cap (acceptance 2), a bandwidth
schedule (acceptance 3) and Toxiproxy's per-connection bandwidth, for contrast."""

from __future__ import annotations

import asyncio

import pytest

from testbed.link.client import LinkClient

pytestmark = pytest.mark.timeout(60)

MBIT = 1e6 / 8  # bytes/s


async def _run_blasters(addr: tuple[str, int], n: int, seconds: float, blaster) -> None:  # type: ignore[no-untyped-def]
    await asyncio.gather(*(blaster(addr, seconds) for _ in range(n)))


async def test_link_cap_is_shared_by_8_connections(client: LinkClient, sink, blaster, addr_of):  # type: ignore[no-untyped-def]
    p = await client.create_proxy("xdc", upstream=f"{sink.addr[0]}:{sink.addr[1]}")
    await client.set_link_bandwidth("xdc", 100 * MBIT, stream="upstream")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await _run_blasters(addr_of(p), 8, 3.0, blaster)
    rate = sink.rate_between(t0 + 0.7, t0 + 2.7)
    assert rate == pytest.approx(100 * MBIT, rel=0.03), rate / MBIT
    assert len(sink.per_conn) == 8
    # Every connection got a share (round-robin reservations), none was starved.
    assert min(sink.per_conn) > 0.5 * max(sink.per_conn)


async def test_per_connection_bandwidth_is_per_connection(client, sink, blaster, addr_of):  # type: ignore[no-untyped-def]
    p = await client.create_proxy("perconn", upstream=f"{sink.addr[0]}:{sink.addr[1]}")
    await client.add_toxic("perconn", "bandwidth", stream="upstream", attributes={"rate": 1250})
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await _run_blasters(addr_of(p), 2, 2.0, blaster)
    rate = sink.rate_between(t0 + 0.5, t0 + 1.9)
    assert rate == pytest.approx(2 * 10 * MBIT, rel=0.05)  # 2 x 10 Mbit/s, as Toxiproxy


async def test_schedule_steps_show_within_a_second(client, sink, blaster, addr_of):  # type: ignore[no-untyped-def]
    p = await client.create_proxy("sched", upstream=f"{sink.addr[0]}:{sink.addr[1]}")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await client.set_bandwidth_schedule(
        "sched", [(0.0, 100 * MBIT), (1.5, 10 * MBIT), (3.0, 100 * MBIT)], stream="upstream"
    )
    await _run_blasters(addr_of(p), 2, 4.5, blaster)
    for step_at, rate in ((1.5, 10 * MBIT), (3.0, 100 * MBIT)):
        # Within 1 s of the step the measured rate (over 0.3 s) is at the new level.
        got = sink.rate_between(t0 + step_at + 0.45, t0 + step_at + 0.95)
        trace = [round(sink.rate_between(t0 + x / 4, t0 + (x + 1) / 4) / MBIT) for x in range(18)]
        assert got == pytest.approx(rate, rel=0.15), (step_at, got / MBIT, trace)
    before = sink.rate_between(t0 + 0.8, t0 + 1.4)
    assert before == pytest.approx(100 * MBIT, rel=0.15)


async def test_rate_update_applies_live(client, sink, blaster, addr_of):  # type: ignore[no-untyped-def]
    p = await client.create_proxy("live", upstream=f"{sink.addr[0]}:{sink.addr[1]}")
    await client.set_link_bandwidth("live", 50 * MBIT, stream="upstream")
    loop = asyncio.get_running_loop()
    t0 = loop.time()

    async def later() -> None:
        await asyncio.sleep(1.2)
        await client.set_link_bandwidth("live", 5 * MBIT, stream="upstream")

    await asyncio.gather(_run_blasters(addr_of(p), 1, 2.6, blaster), later())
    assert sink.rate_between(t0 + 0.4, t0 + 1.1) == pytest.approx(50 * MBIT, rel=0.1)
    assert sink.rate_between(t0 + 1.8, t0 + 2.5) == pytest.approx(5 * MBIT, rel=0.1)
    metrics = await client.metrics()
    assert 'testbed_link_cap_bytes_per_second{proxy="live",direction="upstream"} 625000.0' in (
        metrics
    )


async def test_link_group_shares_one_cap_across_proxies(client, sink, blaster, addr_of):  # type: ignore[no-untyped-def]
    """Two proxies (say, two decode instances) behind one link: 100 Mbit/s in total."""
    up = f"{sink.addr[0]}:{sink.addr[1]}"
    a = await client.create_proxy("to-d0", upstream=up)
    b = await client.create_proxy("to-d1", upstream=up)
    for name in ("to-d0", "to-d1"):
        await client.add_toxic(
            name, "link_bandwidth", stream="upstream", name="xdc",
            attributes={"rate": 100 * MBIT / 1000, "group": "xdc"},
        )  # fmt: skip
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await asyncio.gather(
        _run_blasters(addr_of(a), 4, 3.0, blaster), _run_blasters(addr_of(b), 4, 3.0, blaster)
    )
    rate = sink.rate_between(t0 + 0.7, t0 + 2.7)
    assert rate == pytest.approx(100 * MBIT, rel=0.05), rate / MBIT
    # changing one member's rate changes the group's
    await client.update_toxic("to-d0", "xdc", attributes={"rate": 20 * MBIT / 1000})
    t1 = loop.time()
    await _run_blasters(addr_of(b), 4, 2.0, blaster)
    assert sink.rate_between(t1 + 0.5, t1 + 1.8) == pytest.approx(20 * MBIT, rel=0.1)
