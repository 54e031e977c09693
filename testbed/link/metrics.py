"""Prometheus text for the link: bytes and current rate per proxy and direction.

Toxiproxy's own series (`toxiproxy_proxy_received_bytes_total`, `..._sent_bytes_total`) keep
their names and labels so existing dashboards work. The `testbed_link_*` series add what a
cross-datacenter experiment needs: the delivered rate over the last second, the shared cap now in
force (link_bandwidth, following its schedule) and open connections.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from testbed.link.proxy import DIRECTIONS, Proxy
from testbed.link.toxics import LinkBandwidthToxic

__all__ = ["RateMeter", "render"]

RATE_WINDOW = 1.0  # seconds over which the current rate is averaged


class RateMeter:
    """Rate of a growing byte counter over the last `window` seconds, from periodic samples."""

    def __init__(self, window: float = RATE_WINDOW) -> None:
        self.window = window
        self._samples: deque[tuple[float, int]] = deque()

    def sample(self, now: float, total: int) -> None:
        self._samples.append((now, total))
        while len(self._samples) > 2 and self._samples[1][0] <= now - self.window:
            self._samples.popleft()

    def rate(self) -> float:
        if len(self._samples) < 2:
            return 0.0
        (t0, b0), (t1, b1) = self._samples[0], self._samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _cap(proxy: Proxy, direction: str) -> float | None:
    caps = [
        w.toxic.rate_bps
        for w in proxy.toxics
        if isinstance(w.toxic, LinkBandwidthToxic) and direction in w.directions
    ]
    return min(caps) if caps else None


def render(proxies: Iterable[Proxy], meters: dict[tuple[str, str], RateMeter]) -> str:
    proxies = list(proxies)
    out: list[str] = []

    def family(name: str, kind: str, help_: str) -> None:
        out.append(f"# HELP {name} {help_}")
        out.append(f"# TYPE {name} {kind}")

    for metric, attr, help_ in (
        ("toxiproxy_proxy_received_bytes_total", "received", "Bytes read from the source."),
        ("toxiproxy_proxy_sent_bytes_total", "sent", "Bytes written to the destination."),
    ):
        family(metric, "counter", help_)
        for p in proxies:
            for d in DIRECTIONS:
                labels = (
                    f'direction="{d}",listener="{_esc(p.listen)}",proxy="{_esc(p.name)}",'
                    f'upstream="{_esc(p.upstream)}"'
                )
                out.append(f"{metric}{{{labels}}} {getattr(p.stats[d], attr)}")
    family("testbed_link_bytes_total", "counter", "Bytes delivered through the link.")
    for p in proxies:
        for d in DIRECTIONS:
            out.append(
                f'testbed_link_bytes_total{{proxy="{_esc(p.name)}",direction="{d}"}} '
                f"{p.stats[d].sent}"
            )
    family(
        "testbed_link_rate_bytes_per_second",
        "gauge",
        f"Delivered rate over the last {RATE_WINDOW:g} s.",
    )
    for p in proxies:
        for d in DIRECTIONS:
            m = meters.get((p.name, d))
            rate = m.rate() if m is not None else 0.0
            out.append(
                f'testbed_link_rate_bytes_per_second{{proxy="{_esc(p.name)}",direction="{d}"}} '
                f"{rate:.1f}"
            )
    family("testbed_link_cap_bytes_per_second", "gauge", "Shared cap in force (link_bandwidth).")
    for p in proxies:
        for d in DIRECTIONS:
            cap = _cap(p, d)
            if cap is not None:
                out.append(
                    f'testbed_link_cap_bytes_per_second{{proxy="{_esc(p.name)}",direction="{d}"}}'
                    f" {cap:.1f}"
                )
    family("testbed_link_connections", "gauge", "Open connections through the proxy.")
    for p in proxies:
        out.append(f'testbed_link_connections{{proxy="{_esc(p.name)}"}} {len(p.connections)}')
    return "\n".join(out) + "\n"
