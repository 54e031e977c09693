"""The cross-datacenter link of a deployment, shaped on a link emulator: KV from PrfaaS to PD-D
goes through it.

Every decode instance gets a proxy that cross-datacenter senders use, and the proxies are shaped
as one link: a `link_bandwidth` cap shared by all of them (one pipe between the datacenters, not
one per decode instance), and a `latency` toxic of RTT/2 with jitter in each direction.
Everything is converted to emulated units by the run's scales (testbed.clock: `Scale` for rates,
the clock for durations).

Where the emulator runs is the substrate's business (a child process on the local substrate, a
container on compose); this module only needs a `LinkClient` on it. Deployments without a second
datacenter get no emulator: the routes are the receivers' own addresses and there is nothing to
sample.

With `link.shaper: tc` the substrate also hands over a `KernelShaper`: the kernel caps the
bandwidth (the emulator's `link_bandwidth` toxic is left out, so the link is shaped once),
bandwidth changes and partitions drive it, and samples read its qdisc counters. Latency and
jitter stay on the emulator either way.

An external router's calls to the PrfaaS prefill instances cross the link's control path
(`add_control_proxies`): one proxy per PrfaaS prefill instance with the link's RTT/2 and jitter
each way and no bandwidth cap (HTTP bodies are not byte-scaled: through the capped link a 150 KB
prompt would be paced at 1/byte_scale of its real rate). They are among `proxies`, so the
nemesis' partition, latency, reset and slow-close faults hit them too, but not among
`kv_proxies`: a bandwidth change leaves them alone and link samples do not count their bytes.

A sample that fails (the emulator's /metrics answers 500 or not at all, its text does not parse,
the qdisc cannot be read) is a `link_miss` history event with the reason (`sample_event`), so
the summary counts the misses and the report and the console show them: a broken /metrics
once made every later sample vanish and a run reported 0.74 GB moved instead of 11.7 GB,
exit 0.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from testbed.clock import LiveClock, Scale
from testbed.config import LinkConfig, ScaleConfig
from testbed.link.client import LinkClient
from testbed.link.tc import WIRE_PER_PAYLOAD
from testbed.metrics.records import HistoryEvent
from testbed.metrics.samples import LinkRate
from testbed.nemesis.verbs import LINK_VERBS, LinkVerbs

__all__ = [
    "CONTROL_PREFIX",
    "EMULATOR_VERBS",
    "LINK_GROUP",
    "LINK_MISS",
    "LINK_TOXIC",
    "SAMPLE_TIMEOUT_S",
    "KernelShaper",
    "LinkSetup",
    "add_control_proxies",
    "add_link_proxies",
    "scrape_link",
]

LINK_GROUP = "xdc"
"""The link_bandwidth group every cross-datacenter proxy of a run shares."""
LINK_TOXIC = "xdc-bandwidth"
"""The name of the shared-cap toxic on each cross-datacenter proxy."""
CONTROL_PREFIX = "ctl-"
"""The name of a control-path proxy is this plus the prefill instance id."""
LINK_MISS = "link_miss"
"""The history event of a link sample that failed: `{"reason": "..."}`."""
SAMPLE_TIMEOUT_S = 5.0
"""A sample not read by then is missed (a docker exec of the compose qdisc read takes tenths of
a second; a hung emulator must not stop the sampling)."""
EMULATOR_VERBS = LinkVerbs("link emulator", LINK_VERBS, "docs/link.md")
"""The link emulator plays every link verb (as toxics; `timeout` also drops in the kernel with
`shaper: tc`)."""
NO_LINK = LinkVerbs("run without a link emulator", frozenset(), "docs/link.md")
_METRIC = re.compile(
    r"^(testbed_link_bytes_total|testbed_link_cap_bytes_per_second)"
    r'\{proxy="([^"]*)",direction="([^"]*)"\} (\S+)$'
)


def scrape_link(text: str, proxies: list[str]) -> tuple[float, float]:
    """(wire bytes delivered in both directions, upstream cap in force) over `proxies`, from the
    emulator's Prometheus text (testbed.link.metrics); 0.0 for a cap no proxy reports."""
    total, cap = 0.0, 0.0
    for line in text.splitlines():
        m = _METRIC.match(line)
        if not m or m.group(2) not in proxies:
            continue
        if m.group(1) == "testbed_link_bytes_total":
            total += float(m.group(4))
        elif m.group(3) == "upstream":
            cap = max(cap, float(m.group(4)))
    return total, cap


class KernelShaper(Protocol):
    """The kernel (tc) side of a link: the local substrate's namespaces (link/netns_link.py)
    or the compose link container's interface."""

    name: str

    async def set_rate(self, rate: float, /) -> None:
        """Cap at `rate` TCP payload bytes/s (emulated); the qdisc gets the wire rate."""
        ...

    async def cut(self) -> None:
        """Drop every packet crossing the link until `mend`."""
        ...

    async def mend(self) -> None: ...

    async def counters(self) -> dict[str, Any] | None:
        """Cumulative qdisc `bytes`, `packets`, `drops`, `overlimits` (wire bytes, emulated),
        the wire `rate` in force and `at`, when they were read (wall seconds since the epoch);
        None to skip this sample."""
        ...


@dataclass
class LinkSetup:
    """The link of one run as the runner and the nemesis see it: routes, proxies, the cap."""

    routes: dict[str, tuple[str, int]]
    """decode instance id -> (host, port) that cross-datacenter KV senders connect to."""
    scale: ScaleConfig
    configured_bytes_per_s: float
    """Real-world configured bandwidth."""
    client: LinkClient | None = None
    proxies: list[str] = field(default_factory=list)
    """Every cross-datacenter proxy of the run: the KV ones and the control path's."""
    control: dict[str, tuple[str, int]] = field(default_factory=dict)
    """prefill instance id -> (host, port) of its control-path proxy (add_control_proxies)."""
    kernel: KernelShaper | None = None
    """The kernel shaper when `link.shaper` is tc; None: the emulator shapes."""
    sender_netns: str | None = None
    """The network namespace PrfaaS KV senders open their connections in (local tc)."""
    _rate: LinkRate = field(default_factory=LinkRate)
    _added: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    """By verb key: (proxy, toxic name) of every toxic its verbs added, in order."""
    _dropping: set[str] = field(default_factory=set)
    """The verb keys that made the kernel shaper drop every packet (`add_timeout`)."""

    @property
    def enabled(self) -> bool:
        return self.client is not None

    @property
    def verbs(self) -> LinkVerbs:
        """Every link verb with an emulator (testbed.nemesis.verbs); none without one."""
        return EMULATOR_VERBS if self.client is not None else NO_LINK

    @property
    def kv_proxies(self) -> list[str]:
        """The proxies KV crosses: capped, sampled, counted in link bytes."""
        ctl = {CONTROL_PREFIX + i for i in self.control}
        return [p for p in self.proxies if p not in ctl]

    @property
    def shaper(self) -> str:
        """Which shaper caps the bandwidth: "tc" or "emulator"."""
        return "tc" if self.kernel is not None else "emulator"

    def to_wire(self, real_bytes_per_s: float) -> float:
        return Scale.of(self.scale).wire_rate(real_bytes_per_s)

    def to_real(self, wire_bytes_per_s: float) -> float:
        return Scale.of(self.scale).real_rate(wire_bytes_per_s)

    async def set_bandwidth(self, real_bytes_per_s: float) -> None:
        """Change the link's cap (real-world bytes/s): the kernel's, or the shared toxic of
        every cross-datacenter proxy."""
        if self.kernel is not None:
            await self.kernel.set_rate(self.to_wire(real_bytes_per_s))
            self.configured_bytes_per_s = real_bytes_per_s
            return
        assert self.client is not None
        for name in self.kv_proxies:
            await self.client.update_toxic(
                name, LINK_TOXIC, attributes={"rate": self.to_wire(real_bytes_per_s) / 1000.0}
            )
        self.configured_bytes_per_s = real_bytes_per_s

    async def partition(self) -> None:
        """Disable every cross-datacenter proxy (the control path's too): open connections are
        closed, new ones refused;
        with the kernel shaper, every packet on the link is dropped too."""
        assert self.client is not None
        if self.kernel is not None:
            await self.kernel.cut()
        for name in self.proxies:
            await self.client.disable(name)

    async def heal(self) -> None:
        """Enable again whichever of the run's proxies are disabled; idempotent."""
        assert self.client is not None
        if self.kernel is not None:
            await self.kernel.mend()
        state = await self.client.proxies()
        for name in self.proxies:
            if not state.get(name, {}).get("enabled", True):
                await self.client.enable(name)

    async def blackhole(self, on: bool) -> None:
        """With the kernel shaper, drop (`on`) or pass again every packet crossing the link;
        without it nothing (the emulator's `timeout` toxic black-holes the data instead)."""
        if self.kernel is not None:
            await (self.kernel.cut() if on else self.kernel.mend())

    # ------------------------------------------------------------ link verbs as toxics

    def _wall_ms(self, real_s: float) -> float:
        return LiveClock.paced(self.scale).wall(real_s) * 1e3

    async def _toxics(
        self,
        key: str,
        kind: str,
        streams: tuple[str, ...],
        attributes: dict[str, Any],
        toxicity: float = 1.0,
    ) -> None:
        """One toxic per stream on every proxy, named "<key>-<n>" (n counts the key's toxics),
        recorded under `key` for `remove`."""
        assert self.client is not None
        added = self._added.setdefault(key, [])
        first = len({name for _, name in added})
        for proxy in self.proxies:
            for n, stream in enumerate(streams, start=first):
                name = f"{key}-{n}"
                await self.client.add_toxic(
                    proxy,
                    kind,
                    name=name,
                    stream=stream,
                    attributes=attributes,
                    toxicity=toxicity,
                )
                added.append((proxy, name))

    async def add_delay(self, key: str, /, *, rtt_s: float, jitter_s: float) -> None:
        attrs = {"latency": self._wall_ms(rtt_s / 2), "jitter": self._wall_ms(jitter_s)}
        await self._toxics(key, "latency", ("upstream", "downstream"), attrs)

    async def add_timeout(self, key: str, /, *, timeout_s: float) -> None:
        """The kernel shaper (if any) drops every packet first, then the proxies black-hole."""
        if self.kernel is not None:
            await self.blackhole(True)
            self._dropping.add(key)
        attrs = {"timeout": round(self._wall_ms(timeout_s))}
        await self._toxics(key, "timeout", ("upstream", "downstream"), attrs)

    async def add_reset(self, key: str, /, *, after_s: float, probability: float) -> None:
        attrs = {"timeout": round(self._wall_ms(after_s))}
        await self._toxics(key, "reset_peer", ("upstream",), attrs, probability)

    async def add_slow_close(self, key: str, /, *, delay_s: float, probability: float) -> None:
        attrs = {"delay": round(self._wall_ms(delay_s))}
        await self._toxics(key, "slow_close", ("upstream", "downstream"), attrs, probability)

    async def add_slicer(
        self, key: str, /, *, average_bytes: int, variation_bytes: int, delay_s: float
    ) -> None:
        """On the data towards the receiver (the emulator's upstream stream); `delay` in wall
        microseconds."""
        attrs = {
            "average_size": average_bytes,
            "size_variation": variation_bytes,
            "delay": round(self._wall_ms(delay_s) * 1e3),
        }
        await self._toxics(key, "slicer", ("upstream",), attrs)

    async def add_data_limit(self, key: str, /, *, limit_bytes: int) -> None:
        await self._toxics(key, "limit_data", ("upstream",), {"bytes": limit_bytes})

    async def remove(self, key: str, /) -> None:
        """Every toxic added under `key`, then the kernel's drop if `key` started it."""
        assert self.client is not None
        for proxy, name in self._added.pop(key, []):
            await self.client.remove_toxic(proxy, name)
        if key in self._dropping:
            self._dropping.discard(key)
            if not self._dropping:  # an overlapping black hole keeps the drop
                await self.blackhole(False)

    async def sample(self) -> dict[str, Any] | None:
        """Cumulative wire bytes across the link, rate since the last sample, cap in force;
        None without a link or when the sample missed (`sample_event` says why)."""
        event = await self.sample_event(0.0)
        return event.data if event is not None and event.kind == "link" else None

    async def sample_event(self, t: float) -> HistoryEvent | None:
        """This tick's history event at `t`: the link's sample (`link`), or a `link_miss` with
        the reason when reading it failed; None when the run has no link to sample, or the
        kernel shaper skips a read (too soon after the last: not a miss)."""
        if self.client is None:
            return None
        try:
            async with asyncio.timeout(SAMPLE_TIMEOUT_S):
                if self.kernel is not None:
                    data = await self._sample_kernel(self.kernel)
                    if data is None:  # the shaper skips a read too soon after the last
                        return None
                else:
                    data = self._sample_emulator(await self.client.metrics())
        except Exception as exc:  # counted and shown, never a run's failure
            why = " ".join(str(exc).split())[:200]
            if not why and isinstance(exc, TimeoutError):
                why = f"no sample within {SAMPLE_TIMEOUT_S:g}s"
            reason = f"{type(exc).__name__}: {why}" if why else type(exc).__name__
            return HistoryEvent(t, LINK_MISS, {"reason": reason, "shaper": self.shaper})
        return HistoryEvent(t, "link", data)

    def _sample_emulator(self, text: str) -> dict[str, Any]:
        total, cap = scrape_link(text, self.kv_proxies)
        now = asyncio.get_running_loop().time()
        gbps = self.to_real(self._rate(now, total)) * 8 / 1e9
        configured = self.to_real(cap) if cap else self.configured_bytes_per_s
        return {"wire_bytes": total, "gbps": gbps, "configured_gbps": configured * 8 / 1e9}

    async def _sample_kernel(self, kernel: KernelShaper) -> dict[str, Any] | None:
        """The qdisc's counters; bytes and rates as payload (wire / WIRE_PER_PAYLOAD), like the
        emulator's, with the raw counters alongside (`qdisc_*`, wire bytes, emulated;
        `qdisc_at`: wall seconds of the read, for rates over exact intervals)."""
        c = await kernel.counters()
        if c is None:
            return None
        now = float(c["at"])  # the read's own time: the sample's `t` may lag it (docker exec)
        total = float(c["bytes"]) / WIRE_PER_PAYLOAD
        gbps = self.to_real(self._rate(now, total)) * 8 / 1e9
        return {
            "wire_bytes": total,
            "gbps": gbps,
            "configured_gbps": self.configured_bytes_per_s * 8 / 1e9,
            "shaper": "tc",
            "qdisc_bytes": int(c["bytes"]),
            "qdisc_packets": int(c["packets"]),
            "qdisc_drops": int(c["drops"]),
            "qdisc_overlimits": int(c["overlimits"]),
            "qdisc_rate": float(c["rate"]),
            "qdisc_at": now,
        }

    async def aclose(self) -> None:
        """Close the API client (the emulator itself belongs to the substrate)."""
        if self.client is not None:
            await self.client.close()


async def add_link_proxies(
    setup: LinkSetup,
    link: LinkConfig,
    upstreams: dict[str, tuple[str, int]],
    listen_for: Callable[[str], str],
) -> None:
    """One proxy per decode instance, shaped as one link: a `link_bandwidth` cap shared by the
    group and RTT/2 (+ jitter) of latency each way, in emulated units. Fills `setup.routes`.
    With a kernel shaper the cap is the kernel's, and the proxies get latency only."""
    assert setup.client is not None
    for decode_id, (host, port) in upstreams.items():
        name = f"xdc-{decode_id}"
        info = await setup.client.create_proxy(
            name, upstream=f"{host}:{port}", listen=listen_for(decode_id)
        )
        setup.proxies.append(name)
        if setup.kernel is None:
            await setup.client.add_toxic(
                name,
                "link_bandwidth",
                name=LINK_TOXIC,
                stream="upstream",
                attributes={"rate": setup.to_wire(link.bandwidth) / 1000.0, "group": LINK_GROUP},
            )
        await _latency_toxics(setup, link, name)
        lhost, lport = info["listen"].rsplit(":", 1)
        setup.routes[decode_id] = (lhost, int(lport))


async def _latency_toxics(setup: LinkSetup, link: LinkConfig, name: str) -> None:
    """RTT/2 (+ jitter) on both directions of proxy `name`, in wall milliseconds."""
    assert setup.client is not None
    clock = LiveClock.paced(setup.scale)
    one_way_ms = clock.wall(link.rtt / 2) * 1e3
    jitter_ms = clock.wall(link.jitter) * 1e3
    if one_way_ms > 0 or jitter_ms > 0:
        for stream in ("upstream", "downstream"):
            await setup.client.add_toxic(
                name,
                "latency",
                name=f"rtt-{stream}",
                stream=stream,
                attributes={"latency": one_way_ms, "jitter": jitter_ms},
            )


async def add_control_proxies(
    setup: LinkSetup, link: LinkConfig, upstreams: dict[str, tuple[str, int]]
) -> dict[str, tuple[str, int]]:
    """One control-path proxy per PrfaaS prefill instance (`upstreams`: its HTTP address),
    listening on 127.0.0.1: the link's RTT/2 and jitter each way, no bandwidth cap, not counted
    in link bytes (see the module's doc). Returns (and keeps in `setup.control`) each
    instance's proxy address, which an external router is given instead of the instance's."""
    assert setup.client is not None
    for prefill_id, (host, port) in upstreams.items():
        name = CONTROL_PREFIX + prefill_id
        info = await setup.client.create_proxy(
            name, upstream=f"{host}:{port}", listen="127.0.0.1:0"
        )
        setup.proxies.append(name)
        await _latency_toxics(setup, link, name)
        lhost, lport = info["listen"].rsplit(":", 1)
        setup.control[prefill_id] = (lhost, int(lport))
    return dict(setup.control)
