"""The policy interface: a pure routing decision, (request, snapshot) -> route, and the registry.

Policies do no I/O and read time only from the snapshot, so the same policy runs live here and in
a future virtual-time simulator, and a unit test can drive it with hand-made snapshots.

A policy class also declares, as class attributes, the facts the rest of the testbed needs about
it (which deployment it runs on, whether it needs a threshold, which scheduler loops the router
runs for it, whether routing reads the prefix caches); nothing else keeps a list of policies.
Every module of this package is imported when the registry is first read, and each registers
its classes with `@POLICIES.register`, so adding a policy is one new file (docs/extending.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal, Protocol, get_args

from testbed.config import DeploymentKind
from testbed.registry import Registry

Cluster = Literal["prfaas", "local"]

__all__ = [
    "POLICIES",
    "InstanceLoad",
    "Policy",
    "RequestView",
    "Route",
    "Snapshot",
    "least_loaded",
]


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
    """A routing policy: `decide` plus the facts the runner and the router read off its class."""

    name: ClassVar[str]
    """What a scenario's `policy.name` and `testbed run --policy` call it."""
    deployment_kind: ClassVar[DeploymentKind]
    """The deployment it runs on when a scenario offers several."""
    needs_threshold: ClassVar[bool]
    """It routes by a length threshold: the scenario's `policy.threshold` (or the planner's
    optimum for `auto`) is put in every snapshot."""
    replans: ClassVar[bool]
    """The router runs the short-term loop for it (the threshold and the link's scarcity move
    while the run goes on; testbed.scheduler.loops)."""
    long_term: ClassVar[bool]
    """The router also runs the long-term loop (local PD instances switch roles)."""
    cache_aware: ClassVar[bool]
    """Routing uses the longest cached prefix anywhere, so the length the scheduler plans with
    is the part no usable cache holds, not the whole prompt."""

    def decide(self, request: RequestView, snapshot: Snapshot) -> Route: ...


_FACTS = ("needs_threshold", "replans", "long_term", "cache_aware")


def _check_policy(cls: type[Policy]) -> None:
    """A class missing a fact (or with a wrong one) is refused when it registers, not when a
    run first reads it."""
    if not isinstance(cls, type):
        raise TypeError(f"{cls!r} is not a class")
    label = f"policy class {cls.__module__}.{cls.__qualname__}"
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"{label}: class attribute 'name' must be a non-empty string")
    kinds = get_args(DeploymentKind)
    if getattr(cls, "deployment_kind", None) not in kinds:
        raise TypeError(f"{label}: class attribute 'deployment_kind' must be one of {kinds}")
    for fact in _FACTS:
        if not isinstance(getattr(cls, fact, None), bool):
            raise TypeError(f"{label}: class attribute {fact!r} must be True or False")
    if not callable(getattr(cls, "decide", None)):
        raise TypeError(f"{label}: needs a decide(request, snapshot) method")


POLICIES: Registry[type[Policy]] = Registry(
    "policy",
    "testbed.policy",
    names=lambda cls: (cls.name,),
    check=_check_policy,
    plugins="prfaas_testbed.policies",
)
"""Every policy class by name; `@POLICIES.register` on a class in a module of this package, or
from outside it: `module:Class`, or an entry point of the `prfaas_testbed.policies` group."""


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
