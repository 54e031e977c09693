"""The policy interface: a pure routing decision, (request, snapshot) -> route.

Policies do no I/O and read time only from the snapshot, so the same policy runs live here and in
a future virtual-time simulator, and a unit test can drive it with hand-made snapshots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

Cluster = Literal["prfaas", "local"]

__all__ = ["InstanceLoad", "Policy", "RequestView", "Route", "Snapshot", "least_loaded"]


@dataclass(frozen=True)
class InstanceLoad:
    id: str
    cluster: Cluster
    role: Literal["prefill", "decode"]
    outstanding: int
    """Requests dispatched to the instance and not finished there."""
    outstanding_work: float
    """Prefill: uncached tokens queued or running; decode: output tokens still to generate."""


@dataclass(frozen=True)
class RequestView:
    id: str
    input_tokens: int
    output_tokens: int
    cached_local: int = 0
    """Longest cached prefix of the request in the local PD cluster (tokens)."""
    cached_prfaas: int = 0


@dataclass(frozen=True)
class Snapshot:
    now: float
    instances: tuple[InstanceLoad, ...]
    threshold_tokens: float | None = None
    """The threshold currently in force (from the scenario or the planner)."""
    bandwidth_scarce: bool = False
    """The short-term loop judges the cross-datacenter link scarce (see scheduler.shortterm)."""


@dataclass(frozen=True)
class Route:
    prefill_cluster: Cluster
    prefill_instance: str
    decode_instance: str
    uncached_tokens: int
    threshold_tokens: float | None = None
    pull_prefix_tokens: int = 0
    """Cached prefix to move from the other cluster before prefill (cache-aware, abundant)."""


class Policy(Protocol):
    name: str

    def decide(self, request: RequestView, snapshot: Snapshot) -> Route: ...


def least_loaded(snapshot: Snapshot, cluster: Cluster | None, role: str) -> InstanceLoad:
    """The instance of `role` (in `cluster`, if given) with the least outstanding work."""
    candidates = [
        i
        for i in snapshot.instances
        if i.role == role and (cluster is None or i.cluster == cluster)
    ]
    if not candidates:
        where = f" in cluster {cluster!r}" if cluster else ""
        raise LookupError(f"no {role} instance{where}")
    return min(candidates, key=lambda i: (i.outstanding_work, i.outstanding, i.id))
