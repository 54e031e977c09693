"""The cross-datacenter link of a live run: KV from PrfaaS to PD-D goes through it.

`start_link` runs the link emulator (`testbed link serve`) as its own process, gives every
decode instance a proxy that cross-datacenter senders use, and shapes them as one link: a
`link_bandwidth` cap shared by all of them (one pipe between the datacenters, not one per
decode instance), and a `latency` toxic of RTT/2 with jitter in each direction. Everything is
converted to emulated units by the run's scales (testbed.clock: `Scale` for rates, the clock
for durations).

Deployments without a second datacenter get no emulator: the routes are the receivers' own
addresses and there is nothing to sample.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.clock import LiveClock, Scale
from testbed.config import LinkConfig, ScaleConfig
from testbed.errors import UserError
from testbed.lifeline import child_env
from testbed.link.client import LinkClient

__all__ = ["LINK_GROUP", "LinkSetup", "add_link_proxies", "start_link"]

LINK_GROUP = "xdc"
"""The link_bandwidth group every cross-datacenter proxy of a run shares."""
LINK_TOXIC = "xdc-bandwidth"
_METRIC = re.compile(
    r"^(testbed_link_bytes_total|testbed_link_cap_bytes_per_second)"
    r'\{proxy="([^"]*)",direction="([^"]*)"\} (\S+)$'
)


@dataclass
class LinkSetup:
    routes: dict[str, tuple[str, int]]
    """decode instance id -> (host, port) that cross-datacenter KV senders connect to."""
    scale: ScaleConfig
    configured_bytes_per_s: float
    """Real-world configured bandwidth."""
    client: LinkClient | None = None
    proc: asyncio.subprocess.Process | None = None
    proxies: list[str] = field(default_factory=list)
    _last: tuple[float, float] | None = None

    @property
    def enabled(self) -> bool:
        return self.client is not None

    def to_wire(self, real_bytes_per_s: float) -> float:
        return Scale.of(self.scale).wire_rate(real_bytes_per_s)

    def to_real(self, wire_bytes_per_s: float) -> float:
        return Scale.of(self.scale).real_rate(wire_bytes_per_s)

    async def set_bandwidth(self, real_bytes_per_s: float) -> None:
        """Change the shared cap of every cross-datacenter proxy (real-world bytes/s)."""
        assert self.client is not None
        for name in self.proxies:
            await self.client.update_toxic(
                name, LINK_TOXIC, attributes={"rate": self.to_wire(real_bytes_per_s) / 1000.0}
            )
        self.configured_bytes_per_s = real_bytes_per_s

    async def sample(self) -> dict[str, Any] | None:
        """Cumulative wire bytes across the link, rate since the last sample, cap in force."""
        if self.client is None:
            return None
        try:
            text = await self.client.metrics()
        except Exception:  # a sample missed is a gap in a plot, not a failed run
            return None
        total, cap = 0.0, 0.0
        for line in text.splitlines():
            m = _METRIC.match(line)
            if not m or m.group(2) not in self.proxies:
                continue
            if m.group(1) == "testbed_link_bytes_total":
                total += float(m.group(4))
            elif m.group(3) == "upstream":
                cap = max(cap, float(m.group(4)))
        now = asyncio.get_running_loop().time()
        gbps = 0.0
        if self._last is not None and now > self._last[0]:
            wire_rate = (total - self._last[1]) / (now - self._last[0])
            gbps = self.to_real(wire_rate) * 8 / 1e9
        self._last = (now, total)
        configured = self.to_real(cap) if cap else self.configured_bytes_per_s
        return {"wire_bytes": total, "gbps": gbps, "configured_gbps": configured * 8 / 1e9}

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.close()
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(5):
                    await self.proc.wait()
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


async def _spawn_emulator(
    seed: int, log_dir: Path | None
) -> tuple[asyncio.subprocess.Process, str]:
    stderr: Any = asyncio.subprocess.DEVNULL
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        stderr = (log_dir / "link.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "testbed.cli",
        "link",
        "serve",
        "--port",
        "0",
        "--seed",
        str(seed),
        stdout=asyncio.subprocess.PIPE,
        stderr=stderr,
        start_new_session=True,
        env=child_env(),  # the emulator dies with this process (testbed.lifeline)
    )
    if hasattr(stderr, "close"):
        stderr.close()
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(20):
            while line := (await proc.stdout.readline()).decode():
                if "link emulator API on " in line:
                    return proc, line.rsplit(" ", 1)[1].strip()
    except TimeoutError:
        pass
    proc.kill()
    await proc.wait()
    raise UserError("the link emulator did not start; see link.log in the results")


async def add_link_proxies(
    setup: LinkSetup,
    link: LinkConfig,
    upstreams: dict[str, tuple[str, int]],
    listen_for: Callable[[str], str],
) -> None:
    """One proxy per decode instance, shaped as one link: a `link_bandwidth` cap shared by the
    group and RTT/2 (+ jitter) of latency each way, in emulated units. Fills `setup.routes`."""
    assert setup.client is not None
    clock = LiveClock.paced(setup.scale)
    one_way_ms = clock.wall(link.rtt / 2) * 1e3
    jitter_ms = clock.wall(link.jitter) * 1e3
    for decode_id, (host, port) in upstreams.items():
        name = f"xdc-{decode_id}"
        info = await setup.client.create_proxy(
            name, upstream=f"{host}:{port}", listen=listen_for(decode_id)
        )
        setup.proxies.append(name)
        await setup.client.add_toxic(
            name,
            "link_bandwidth",
            name=LINK_TOXIC,
            stream="upstream",
            attributes={"rate": setup.to_wire(link.bandwidth) / 1000.0, "group": LINK_GROUP},
        )
        if one_way_ms > 0 or jitter_ms > 0:
            for stream in ("upstream", "downstream"):
                await setup.client.add_toxic(
                    name,
                    "latency",
                    name=f"rtt-{stream}",
                    stream=stream,
                    attributes={"latency": one_way_ms, "jitter": jitter_ms},
                )
        lhost, lport = info["listen"].rsplit(":", 1)
        setup.routes[decode_id] = (lhost, int(lport))


async def start_link(
    link: LinkConfig,
    scale: ScaleConfig,
    upstreams: dict[str, tuple[str, int]],
    *,
    enabled: bool,
    seed: int,
    log_dir: Path | None,
) -> LinkSetup:
    """Put the shaped link in front of each decode instance's KV port (see module docstring)."""
    setup = LinkSetup(dict(upstreams), scale, link.bandwidth)
    if not enabled:
        return setup
    if link.toxiproxy is not None:
        url = f"http://{link.toxiproxy}"
        proc = None
    else:
        proc, url = await _spawn_emulator(seed, log_dir)
    setup.proc = proc
    setup.client = LinkClient(url)
    try:
        await add_link_proxies(setup, link, upstreams, lambda _decode_id: "127.0.0.1:0")
    except BaseException:
        await setup.aclose()
        raise
    return setup
