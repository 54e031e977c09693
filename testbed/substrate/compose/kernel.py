"""The compose substrate's kernel link shaper (`link.shaper: tc`): an htb class on the link
container's interface toward the local datacenter, for the whole run.

The link container is the only member of both datacenter networks and has NET_ADMIN, so what
leaves it toward the local datacenter is exactly what crossed the link (KV from the proxies to
the decode instances). `set_rate` is the substrate's `shape_link` with htb (a rate change keeps
the class, so nothing queued is dropped); `cut` grafts a zero-length pfifo under the class (a
partition drops every packet, counted); `counters` reads `tc -s -j qdisc show` through `docker
exec`, at most once a second, since each exec costs the host a process start.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from testbed.errors import UserError
from testbed.link.tc import WIRE_PER_PAYLOAD
from testbed.substrate.compose.topology import Topology

__all__ = ["ComposeKernel"]

MIN_COUNTER_INTERVAL_S = 1.0
"""Wall seconds between two reads of the counters (a docker exec each)."""


def _dev(topology: Topology) -> str:
    """Shell that sets $dev to the link container's interface on the local network."""
    mac = topology.link_container.attrs["NetworkSettings"]["Networks"][topology.networks["local"]][
        "MacAddress"
    ]
    return f"dev=$(ip -o link | grep -i '{mac}' | head -1 | cut -d: -f2 | cut -d@ -f1 | tr -d ' ');"


class ComposeKernel:
    """`testbed.link.deployment.KernelShaper` on the compose link container."""

    name = "tc"

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.rate = 0.0
        """Payload bytes/s (emulated) the class is set to."""
        self._last_read = -MIN_COUNTER_INTERVAL_S
        self._loop = asyncio.get_running_loop()
        self._dev: str | None = None
        """The shell that finds the interface; its MAC is read once (a Docker API call)."""

    async def _exec(self, script: str) -> str:
        if self._dev is None:
            await asyncio.to_thread(self.topology.link_container.reload)
            self._dev = _dev(self.topology)
        rc, out = await asyncio.to_thread(
            self.topology.link_container.exec_run,
            ["sh", "-c", self._dev + script],
            demux=False,
        )
        text = (out or b"").decode(errors="replace")
        if rc != 0:
            raise UserError(f"tc in the link container failed: {text.strip()}")
        return text

    async def set_rate(self, rate: float) -> None:
        await self.topology.tc(rate * WIRE_PER_PAYLOAD, "htb")
        self.rate = rate

    async def cut(self) -> None:
        await self._exec(" tc qdisc replace dev $dev parent 1:1 handle 10: pfifo limit 0")

    async def mend(self) -> None:
        await self._exec(" tc qdisc del dev $dev parent 1:1 2>/dev/null; true")

    async def counters(self) -> dict[str, Any] | None:
        """The root qdisc's counters and the wire rate; None when read less than a second ago
        (LinkSetup skips that sample)."""
        now = self._loop.time()
        if now - self._last_read < MIN_COUNTER_INTERVAL_S:
            return None
        self._last_read = now
        # Timestamped in the container, next to the read: a docker exec takes a variable tenth
        # of a second or more, which would otherwise skew the rates of 1 s windows.
        text = await self._exec(" date +%s.%N; tc -s -j qdisc show dev $dev")
        stamp, _, body = text.strip().partition("\n")
        qdiscs: list[dict[str, Any]] = json.loads(body or "[]")
        root = next((q for q in qdiscs if q.get("root")), {})
        return {
            "bytes": int(root.get("bytes", 0)),
            "packets": int(root.get("packets", 0)),
            "drops": int(root.get("drops", 0)),  # htb counts its leaves' drops here too
            "overlimits": int(root.get("overlimits", 0)),
            "rate": self.rate * WIRE_PER_PAYLOAD,
            "at": float(stamp),
        }
