"""The live link plays every link verb (testbed.nemesis.verbs) on a real in-process emulator:
each `add_*` leaves the toxics the emulator accepts (a bad attribute would be a 400), named
after its key, on every proxy; `remove(key)` takes exactly those away, and the data limit and
the slicer act on the bytes through the proxy. With a kernel shaper, `timeout` drops packets in
the kernel until the last black hole is removed."""

from __future__ import annotations

import asyncio
from typing import Any

from testbed.config import LinkConfig, ScaleConfig
from testbed.link.client import LinkClient
from testbed.link.deployment import EMULATOR_VERBS, LinkSetup, add_link_proxies
from testbed.nemesis import LINK_VERBS

SCALE = ScaleConfig(time_scale=10, byte_scale=1000)


async def _setup(client: LinkClient, echo: tuple[str, int], **kw: Any) -> LinkSetup:
    link = LinkConfig(bandwidth=12.5e9, rtt=0.02)
    setup = LinkSetup({}, SCALE, link.bandwidth, client=client, **kw)
    await add_link_proxies(setup, link, {"local-decode-0": echo}, lambda _d: "127.0.0.1:0")
    return setup


async def _toxics(client: LinkClient, proxy: str) -> dict[str, tuple[Any, ...]]:
    return {
        t["name"]: (t["type"], t["stream"], t["attributes"], t["toxicity"])
        for t in await client.toxics(proxy)
        if t["name"].startswith("k-")
    }


async def test_every_verb_is_a_toxic_the_emulator_accepts_and_remove_undoes_it(
    client: LinkClient, echo: tuple[str, int]
) -> None:
    setup = await _setup(client, echo)
    assert setup.verbs == EMULATOR_VERBS and EMULATOR_VERBS.supported == LINK_VERBS
    (proxy,) = setup.proxies
    before = {t["name"] for t in await client.toxics(proxy)}
    await setup.add_delay("k-d", rtt_s=0.2, jitter_s=0.1)
    await setup.add_timeout("k-t", timeout_s=2.0)
    await setup.add_reset("k-r", after_s=3.0, probability=0.25)
    await setup.add_slow_close("k-c", delay_s=5.0, probability=0.5)
    await setup.add_slicer("k-s", average_bytes=64, variation_bytes=8, delay_s=0.01)
    await setup.add_data_limit("k-l", limit_bytes=4096)
    got = await _toxics(client, proxy)
    assert got == {
        "k-d-0": ("latency", "upstream", {"latency": 10, "jitter": 10}, 1.0),
        "k-d-1": ("latency", "downstream", {"latency": 10, "jitter": 10}, 1.0),
        "k-t-0": ("timeout", "upstream", {"timeout": 200}, 1.0),
        "k-t-1": ("timeout", "downstream", {"timeout": 200}, 1.0),
        "k-r-0": ("reset_peer", "upstream", {"timeout": 300}, 0.25),
        "k-c-0": ("slow_close", "upstream", {"delay": 500}, 0.5),
        "k-c-1": ("slow_close", "downstream", {"delay": 500}, 0.5),
        "k-s-0": (
            "slicer", "upstream", {"average_size": 64, "size_variation": 8, "delay": 1000}, 1.0
        ),
        "k-l-0": ("limit_data", "upstream", {"bytes": 4096}, 1.0),
    }  # fmt: skip
    for key in ("k-d", "k-t", "k-r", "k-c", "k-s", "k-l", "k-none"):
        await setup.remove(key)
    assert {t["name"] for t in await client.toxics(proxy)} == before


async def _through(addr: tuple[str, int], data: bytes) -> bytes:
    r, w = await asyncio.wait_for(asyncio.open_connection(*addr), 5)
    try:
        w.write(data)
        await w.drain()
        w.write_eof()
        return await asyncio.wait_for(r.read(-1), 10)
    finally:
        w.close()


DATA = bytes(range(256)) * 64


async def test_the_slicer_cuts_the_bytes_and_they_arrive_whole(
    client: LinkClient, echo: tuple[str, int]
) -> None:
    setup = await _setup(client, echo)
    await setup.add_slicer("k-s", average_bytes=100, variation_bytes=10, delay_s=0.0)
    route = setup.routes["local-decode-0"]
    assert await _through(route, DATA) == DATA
    await setup.remove("k-s")
    assert await _through(route, DATA) == DATA


async def test_the_data_limit_closes_a_connection_after_its_bytes(
    client: LinkClient, sink: Any
) -> None:
    limited = await _setup(client, sink.addr)
    await limited.add_data_limit("k-l", limit_bytes=1000)
    await _through(limited.routes["local-decode-0"], DATA)
    for _ in range(100):  # bounded: the proxy's close reaches the sink at once
        if sink.eofs:
            break
        await asyncio.sleep(0.01)
    assert sink.total == 1000  # the connection closed once 1000 bytes went upstream


class Kernel:
    name = "tc"

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def set_rate(self, rate: float, /) -> None:
        self.calls.append("rate")

    async def cut(self) -> None:
        self.calls.append("cut")

    async def mend(self) -> None:
        self.calls.append("mend")

    async def counters(self) -> dict[str, Any] | None:
        return None


async def test_timeout_drops_in_the_kernel_until_the_last_black_hole_ends(
    client: LinkClient, echo: tuple[str, int]
) -> None:
    kernel = Kernel()
    setup = await _setup(client, echo, kernel=kernel)
    await setup.add_timeout("k-1", timeout_s=0.0)
    await setup.add_timeout("k-2", timeout_s=0.0)
    assert kernel.calls == ["cut", "cut"]
    await setup.remove("k-1")
    assert kernel.calls == ["cut", "cut"]  # the other black hole still holds
    await setup.remove("k-2")
    assert kernel.calls == ["cut", "cut", "mend"]
    await setup.add_delay("k-3", rtt_s=0.1, jitter_s=0.0)
    await setup.remove("k-3")
    assert kernel.calls == ["cut", "cut", "mend"]  # latency stays on the emulator
