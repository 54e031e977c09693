"""A run's kernel-shaped link on the local substrate (`link.shaper: tc`).

Two network namespaces per run, `tbl-r<pid>-a` (the PrfaaS side) and `tbl-r<pid>-b` (the local
datacenter's side), joined by a veth pair (testbed.link.tc). The PrfaaS prefill workers open
their KV connections in namespace a and the link emulator's proxies listen in namespace b
(testbed.transfer.netns), so every cross-datacenter KV byte crosses the veth, and the veth's
egress toward the local datacenter is shaped by an htb class at the link's bandwidth. Latency and
jitter still come from the emulator's toxics (this kernel has no netem; `NetnsLink.netem` says
whether one does); its bandwidth toxic is left out, so the link is shaped once.

The pid in the names makes them unique per run and lets the next run (or `testbed link tc down
--stale`) remove what a killed run left behind. A preflight on a scratch pair (`preflight`)
stops a run before anything starts when root, iproute2 or sch_htb is missing.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import time
from typing import Any

from testbed.errors import UserError
from testbed.link import tc

__all__ = ["NetnsLink", "preflight"]

QDISC = "htb"
"""The run's shaper: an htb class, changed in place (a rate change drops nothing queued)."""


def _probe_name() -> str:
    return f"p{os.getpid()}"


def preflight() -> bool:
    """Check this machine can shape a run's link in the kernel; returns whether it has netem.

    Raises UserError with one line naming what is missing: root, `ip`/`tc`, network namespaces
    or veth, or the sch_htb qdisc (tried on a scratch pair, deleted again)."""
    tc.check_available()
    tc.teardown(_probe_name())  # an earlier probe of this process that did not finish
    try:
        probe = tc.create_pair(_probe_name())
    except UserError as exc:
        raise UserError(f"tc shaping needs network namespaces and veth pairs: {exc}") from None
    try:
        try:
            probe.set_rate(1e6, qdisc=QDISC, both=False)
        except UserError as exc:
            raise UserError(
                f"tc shaping needs the sch_{QDISC} qdisc, which this kernel lacks ({exc})"
            ) from None
        return probe.has_netem()
    finally:
        probe.delete()


def _run_name() -> str:
    """`r<pid>`, or `r<pid>-<n>` when this process has a run's pair already."""
    base = f"r{os.getpid()}"
    taken = set(tc.list_pairs())
    if base not in taken:
        return base
    n = 2
    while f"{base}-{n}" in taken:
        n += 1
    return f"{base}-{n}"


class NetnsLink:
    """One run's namespaces, veth and htb class; `testbed.link.deployment.KernelShaper`."""

    name = "tc"

    def __init__(self, pair: tc.NetnsPair, netem: bool) -> None:
        self.pair = pair
        self.netem = netem
        self.rate: float = 0.0
        """Payload bytes/s (emulated) the class is set to; the qdisc has the wire rate."""
        self.removed_stale: list[str] = []
        self._closed = False
        atexit.register(self.close)  # a crash that skips the substrate's stop still cleans up

    @classmethod
    def create(cls, rate: float) -> NetnsLink:
        """Preflight, remove stale namespaces of dead runs, make this run's pair shaped at
        `rate` payload bytes/s (emulated) toward the local side."""
        netem = preflight()
        stale = tc.teardown(stale=True)
        pair = tc.create_pair(_run_name(), rate=rate, qdisc=QDISC, both=False)
        link = cls(pair, netem)
        link.rate = rate
        link.removed_stale = stale
        return link

    @property
    def sender_netns(self) -> str:
        """Where the PrfaaS side opens its KV connections."""
        return self.pair.ns_a

    @property
    def listen_netns(self) -> str:
        """Where the link emulator's proxies listen (the local datacenter's side)."""
        return self.pair.ns_b

    @property
    def listen_host(self) -> str:
        return self.pair.addr_b

    @property
    def wire_rate(self) -> float:
        """The qdisc's rate, wire bytes/s (emulated)."""
        return self.rate * tc.WIRE_PER_PAYLOAD

    async def set_rate(self, rate: float) -> None:
        """Payload bytes/s (emulated); the qdisc gets the matching wire rate."""
        await asyncio.to_thread(self.pair.set_rate, rate, qdisc=QDISC, both=False)
        self.rate = rate

    async def cut(self) -> None:
        await asyncio.to_thread(self.pair.cut, "a")

    async def mend(self) -> None:
        await asyncio.to_thread(self.pair.mend, "a")

    async def counters(self) -> dict[str, Any]:
        """The shaped end's qdisc counters plus the wire rate in force, and `at`: when they were
        read (wall seconds since the epoch, the middle of the `tc` call)."""

        def read() -> dict[str, Any]:
            before = time.time()
            c: dict[str, Any] = dict(self.pair.counters("a"))
            c["at"] = (before + time.time()) / 2
            return c

        c = await asyncio.to_thread(read)
        c["rate"] = self.wire_rate
        return c

    def close(self) -> None:
        """Delete both namespaces (the veth and its qdiscs go with them); idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        self.pair.delete()
