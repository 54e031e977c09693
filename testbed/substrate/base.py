"""What a substrate provides to a run: start services, shape the link, and hurt things.

The runner and the nemesis only speak this interface, so a scenario runs unchanged on local
processes or on containers. Addresses come in two kinds: `url` is where the runner (on the host)
reaches a service's HTTP API; `kv_addr` is where senders in the same datacenter reach a decode
instance's KV receiver. Cross-datacenter senders get their address from the link
(testbed.link.deployment), which the substrate puts on a link emulator it runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from testbed.config import LinkConfig, ScaleConfig
from testbed.link.deployment import LinkSetup
from testbed.services.spec import ServiceSpec

__all__ = ["ServiceHandle", "Substrate"]


@dataclass
class ServiceHandle:
    spec: ServiceSpec
    url: str
    """HTTP API as the runner reaches it."""
    kv_addr: tuple[str, int] | None = None
    """KV receiver as same-datacenter senders reach it (decode instances only)."""
    ref: object = None
    """The substrate's own handle (a process, a container)."""
    extra: dict[str, object] = field(default_factory=dict)


class Substrate(Protocol):
    name: str

    async def warm(self, roles: list[str], link: LinkConfig | None, seed: int) -> None:
        """Get ready to start services of these roles (one each) and, with `link`, the link:
        a substrate that can start them ahead does (local: the service zygote, which imports
        every role's app once), others do nothing. Only a speed-up: `start_service` works
        without it."""
        ...

    async def start_service(self, spec: ServiceSpec) -> ServiceHandle: ...

    async def start_link(
        self,
        link: LinkConfig,
        scale: ScaleConfig,
        upstreams: dict[str, tuple[str, int]],
        *,
        enabled: bool,
        seed: int,
    ) -> LinkSetup:
        """Proxies for cross-datacenter KV to each decode instance (`upstreams`), shaped as one
        link; with `enabled` false (one datacenter) the routes are the upstreams themselves."""
        ...

    async def partition(self) -> None:
        """Cut the datacenters apart until `heal`; what senders see (connections closed at once,
        or packets dropped) is the substrate's to document."""
        ...

    async def heal(self) -> None:
        """Undo `partition`; idempotent."""
        ...

    async def shape_link(self, rate_bytes_per_s: float | None, *, qdisc: str = "tbf") -> str:
        """Kernel (tc) shaping of what crosses the link toward the local datacenter, in wire
        bytes/s with the `tbf` or `htb` qdisc; `None` removes it. Returns the qdiscs in force.
        A substrate that cannot shape in the kernel raises UserError."""
        ...

    async def exited(self, handle: ServiceHandle) -> str | None:
        """How a service ended (a short reason), or None while it runs or is paused."""
        ...

    async def kill(self, handle: ServiceHandle) -> None:
        """SIGKILL: the instance dies with whatever it held."""
        ...

    async def pause(self, handle: ServiceHandle) -> None:
        """SIGSTOP / docker pause: alive but silent."""
        ...

    async def resume(self, handle: ServiceHandle) -> None: ...

    async def restart(self, handle: ServiceHandle) -> ServiceHandle:
        """Start the instance again with the same identity; returns its new handle."""
        ...

    async def stop_all(self) -> None:
        """Stop every service and the link; idempotent."""
        ...
