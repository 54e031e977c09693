"""A run's link when the kernel shapes it (testbed.link.deployment with a `KernelShaper`): the
proxies get latency only, a bandwidth change and a partition go to the kernel, samples are the
qdisc's counters with rates over the reads' own times. A recording shaper stands in for the
kernel here; the real one is tests/link/test_netns_link.py (root)."""

from __future__ import annotations

from typing import Any

import pytest

from testbed.config import LinkConfig, ScaleConfig
from testbed.link.client import LinkClient
from testbed.link.deployment import LINK_TOXIC, LinkSetup, add_link_proxies
from testbed.link.tc import WIRE_PER_PAYLOAD
from testbed.metrics.records import HistoryEvent
from testbed.metrics.report import _shaper_line
from testbed.metrics.summary import link_stats


class Kernel:
    name = "tc"

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.reads = [
            {"bytes": 0, "packets": 0, "drops": 0, "overlimits": 0, "rate": 1.0, "at": 100.0},
            {"bytes": 2e6 * WIRE_PER_PAYLOAD, "packets": 9, "drops": 1, "overlimits": 4,
             "rate": 1.0, "at": 102.0},
        ]  # fmt: skip

    async def set_rate(self, rate: float, /) -> None:
        self.calls.append(("rate", rate))

    async def cut(self) -> None:
        self.calls.append(("cut",))

    async def mend(self) -> None:
        self.calls.append(("mend",))

    async def counters(self) -> dict[str, Any] | None:
        return self.reads.pop(0) if self.reads else None


async def test_the_kernel_caps_cuts_and_counts(client: LinkClient, echo: tuple[str, int]) -> None:
    scale = ScaleConfig(time_scale=10, byte_scale=1000)
    link = LinkConfig(bandwidth=12.5e9, rtt=0.2, shaper="tc")
    kernel = Kernel()
    setup = LinkSetup({}, scale, link.bandwidth, client=client, kernel=kernel)
    assert setup.shaper == "tc"
    await add_link_proxies(setup, link, {"local-decode-0": echo}, lambda _d: "127.0.0.1:0")
    toxics = {t["name"] for t in await client.toxics(setup.proxies[0])}
    assert LINK_TOXIC not in toxics and {"rtt-upstream", "rtt-downstream"} <= toxics

    await setup.set_bandwidth(1.25e9)  # real bytes/s -> 12.5 MB/s emulated, to the kernel
    assert kernel.calls == [("rate", pytest.approx(12.5e6))]
    assert setup.configured_bytes_per_s == 1.25e9

    await setup.partition()
    assert kernel.calls[-1] == ("cut",)
    assert not (await client.get_proxy(setup.proxies[0]))["enabled"]
    await setup.heal()
    assert kernel.calls[-1] == ("mend",)
    assert (await client.get_proxy(setup.proxies[0]))["enabled"]
    await setup.blackhole(True)  # partition mode timeout: the kernel drops, proxies stay up
    assert kernel.calls[-1] == ("cut",) and (await client.get_proxy(setup.proxies[0]))["enabled"]
    await setup.blackhole(False)
    assert kernel.calls[-1] == ("mend",)
    n = len(kernel.calls)
    await LinkSetup({}, scale, link.bandwidth, client=client).blackhole(True)  # no kernel
    assert len(kernel.calls) == n

    first, second = await setup.sample(), await setup.sample()
    assert first is not None and second is not None and await setup.sample() is None
    # 2 MB of payload in 2 s of the reads' own time: 1 MB/s emulated = 100 MB/s real = 0.8 Gbps
    assert second["gbps"] == pytest.approx(0.8)
    assert second["qdisc_drops"] == 1 and second["qdisc_overlimits"] == 4
    assert second["shaper"] == "tc" and second["configured_gbps"] == pytest.approx(10.0)

    history = [HistoryEvent(1.0, "link", first), HistoryEvent(2.0, "link", second)]
    stats = link_stats(history, byte_scale=1000)
    assert stats["kernel"] == {
        "bytes": round(2e6 * WIRE_PER_PAYLOAD), "packets": 9, "drops": 1, "overlimits": 4
    }  # fmt: skip
    assert "1 drops, 4 overlimits" in _shaper_line({**stats, "shaper": "tc"})
    assert _shaper_line({"shaper": "emulator"}).startswith("Shaper: emulator")
