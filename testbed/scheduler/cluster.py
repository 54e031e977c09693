"""What the control loops need from the router, and nothing more.

The loops (scheduler.loops) sit below the services: they never import the router. The router
hands them an object with this shape: its view of the instances, its own load accounting, and
two calls that reach an instance (read a PrfaaS sender's counters, switch a PD instance's role).
A test hands them a fake with dicts and canned counters instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from testbed.frozen import quick_init

__all__ = ["Cluster", "InstanceView", "Role", "SenderCounters"]

Role = Literal["prefill", "decode"]


class InstanceView(Protocol):
    """One instance as the router sees it (services.spec.InstanceInfo has this shape)."""

    @property
    def id(self) -> str: ...

    @property
    def cluster(self) -> str: ...

    @property
    def role(self) -> str: ...

    @property
    def switchable(self) -> bool: ...


@quick_init
@dataclass(frozen=True)
class SenderCounters:
    """A prefill instance's KV sender counters, in emulated (wire) bytes."""

    bytes_acked: float
    """Acknowledged by the receivers so far (cumulative)."""
    in_flight_bytes: float
    """Sent, not yet acknowledged."""
    queued_bytes: float
    """Waiting for the sender's window: as much a queue as bytes in flight."""


class Cluster(Protocol):
    """The router, as the control loops see it."""

    @property
    def instances(self) -> Mapping[str, InstanceView]:
        """Every instance by id, in its current role."""
        ...

    @property
    def healthy(self) -> Mapping[str, bool]:
        """False while an instance is out of rotation (it failed; /health brings it back)."""
        ...

    @property
    def outstanding(self) -> Mapping[str, int]:
        """Requests the router has in flight on each instance."""
        ...

    @property
    def work(self) -> Mapping[str, float]:
        """Tokens of those requests (prefill: uncached prompt tokens; decode: output tokens)."""
        ...

    async def sender_stats(self, instances: Sequence[str]) -> list[SenderCounters | None]:
        """Each instance's sender counters now (None for one that did not answer), in order.
        All at once: the live router asks them concurrently; the sim reads its counters
        without a task per instance (the short-term loop asks every tick)."""
        ...

    async def switch_role(self, instance: str, role: Role, switch_s: float) -> bool:
        """Ask a drained switchable instance to serve `role` (the switch itself takes
        `switch_s` real-world seconds); True once it does and the router routes to it as such."""
        ...
