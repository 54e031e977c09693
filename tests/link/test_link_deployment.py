"""A run's link on the emulator (testbed.link.deployment): one proxy per decode instance, one
shared cap in emulated units, RTT/2 each way, a bandwidth change on every proxy, samples read
from the emulator's metrics."""

from __future__ import annotations

import asyncio

import pytest

from testbed.config import LinkConfig, ScaleConfig
from testbed.link.client import LinkClient
from testbed.link.deployment import (
    LINK_GROUP,
    LINK_TOXIC,
    LinkSetup,
    add_control_proxies,
    add_link_proxies,
    scrape_link,
)


async def test_proxies_share_one_cap_in_emulated_units(
    client: LinkClient, echo: tuple[str, int]
) -> None:
    scale = ScaleConfig(time_scale=10, byte_scale=1000)
    link = LinkConfig(bandwidth=12.5e9, rtt=0.2, jitter=0.01)
    setup = LinkSetup({}, scale, link.bandwidth, client=client)
    upstreams = {"local-decode-0": echo, "local-decode-1": echo}
    await add_link_proxies(setup, link, upstreams, lambda _decode_id: "127.0.0.1:0")
    assert setup.proxies == ["xdc-local-decode-0", "xdc-local-decode-1"]
    assert set(setup.routes) == set(upstreams) and setup.routes["local-decode-0"] != echo
    for name in setup.proxies:
        toxics = {t["name"]: t for t in await client.toxics(name)}
        cap = toxics[LINK_TOXIC]["attributes"]
        # 12.5 GB/s real x time_scale 10 / byte_scale 1000 = 125 MB/s on the wire, in KB/s
        assert cap["rate"] == pytest.approx(125_000.0) and cap["group"] == LINK_GROUP
        # 100 ms one way real / time_scale 10 = 10 ms on the wall clock
        assert toxics["rtt-upstream"]["attributes"]["latency"] == pytest.approx(10.0)
        assert toxics["rtt-downstream"]["attributes"]["jitter"] == pytest.approx(1.0)

    await setup.set_bandwidth(1.25e9)
    assert setup.configured_bytes_per_s == 1.25e9
    for name in setup.proxies:
        toxics = {t["name"]: t for t in await client.toxics(name)}
        assert toxics[LINK_TOXIC]["attributes"]["rate"] == pytest.approx(12_500.0)
    sample = await setup.sample()
    assert sample is not None
    assert sample["configured_gbps"] == pytest.approx(10.0)  # 1.25 GB/s real


def test_scrape_counts_only_the_runs_proxies() -> None:
    text = "\n".join(
        [
            "# TYPE testbed_link_bytes_total counter",
            'testbed_link_bytes_total{proxy="xdc-a",direction="upstream"} 100',
            'testbed_link_bytes_total{proxy="xdc-a",direction="downstream"} 5',
            'testbed_link_bytes_total{proxy="other",direction="upstream"} 1000',
            'testbed_link_cap_bytes_per_second{proxy="xdc-a",direction="upstream"} 2500.0',
            'testbed_link_cap_bytes_per_second{proxy="xdc-a",direction="downstream"} 9999.0',
            'testbed_link_cap_bytes_per_second{proxy="other",direction="upstream"} 8000.0',
        ]
    )
    assert scrape_link(text, ["xdc-a"]) == (105.0, 2500.0)
    assert scrape_link(text, []) == (0.0, 0.0)


async def test_control_proxies_delay_and_cut_but_neither_cap_nor_count(
    client: LinkClient, echo: tuple[str, int]
) -> None:
    """An external router's path to a PrfaaS prefill: the link's latency both ways, cut by a
    partition, but no bandwidth toxic (a bandwidth change skips it) and no bytes in the link's
    samples."""
    scale = ScaleConfig(time_scale=1, byte_scale=1000)
    link = LinkConfig(bandwidth=12.5e9, rtt=0.02, jitter=0.002)
    setup = LinkSetup({}, scale, link.bandwidth, client=client)
    await add_link_proxies(setup, link, {"local-decode-0": echo}, lambda _d: "127.0.0.1:0")
    routes = await add_control_proxies(setup, link, {"prfaas-prefill-0": echo})
    assert setup.kv_proxies == ["xdc-local-decode-0"]
    assert setup.proxies == ["xdc-local-decode-0", "ctl-prfaas-prefill-0"]
    assert routes == setup.control and routes["prfaas-prefill-0"] != echo
    toxics = {t["name"]: t for t in await client.toxics("ctl-prfaas-prefill-0")}
    assert set(toxics) == {"rtt-upstream", "rtt-downstream"}  # no LINK_TOXIC
    assert toxics["rtt-upstream"]["attributes"]["latency"] == pytest.approx(10.0)
    assert toxics["rtt-downstream"]["attributes"]["jitter"] == pytest.approx(2.0)

    host, port = routes["prfaas-prefill-0"]
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"x" * 100_000)
    assert len(await reader.readexactly(100_000)) == 100_000  # echoed through the proxy
    writer.close()
    await setup.set_bandwidth(1.25e9)  # only the KV proxy has the cap to update
    sample = await setup.sample()
    assert sample is not None and sample["wire_bytes"] == 0.0  # the control bytes not counted

    await setup.partition()
    with pytest.raises(OSError):
        await asyncio.open_connection(host, port)
    await setup.heal()
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"ping")
    assert await reader.readexactly(4) == b"ping"
    writer.close()
