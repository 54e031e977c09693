"""The policy interface: a pure routing decision, (request, snapshot) -> route, and the registry.

Policies do no I/O and read time only from the snapshot, so the same policy runs live and on the
virtual-time simulator (testbed.sim), and a unit test can drive it with hand-made snapshots.

The snapshot holds what a production scheduler could observe, and no more: per instance its
load, estimated queue wait and state; the cross-datacenter link as the short-term loop sees it
(estimated bandwidth, bytes in flight, delivered rate, RTT, scarcity); the model's cost curves
(T_prefill per cluster's hardware, S_kv) so a policy can predict without hard-coding them. The
router and the simulator keep it incrementally (testbed.policy.book): finding the least-loaded
instance is a heap lookup, not a scan, so a decision stays cheap at 10,000 instances.

A policy class also declares, as class attributes, the facts the rest of the testbed needs about
it (which deployment it runs on, whether it needs a threshold, which scheduler loops the router
runs for it, whether routing reads the prefix caches or the link); nothing else keeps a list of
policies.
Every module of this package is imported when the registry is first read, and each registers
its classes with `@POLICIES.register`, so adding a policy is one new file (docs/extending.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal, Protocol, get_args

from testbed.config import DeploymentKind
from testbed.config.policy import POLICY_KNOBS, PolicyKnobs
from testbed.frozen import quick_init
from testbed.profiles import Curve, ModelProfile
from testbed.registry import Registry

Cluster = Literal["prfaas", "local"]
InstanceState = Literal["ok", "draining", "suspect"]
"""ok: takes new work. draining: the long-term loop is emptying it before a role switch.
suspect: out of rotation after a failed attempt until its health check answers again."""

__all__ = [
    "POLICIES",
    "CostModel",
    "InstanceLoad",
    "InstanceState",
    "LinkView",
    "Policy",
    "RequestView",
    "Route",
    "Snapshot",
    "least_loaded",
    "measures_link",
]


@quick_init
@dataclass(frozen=True)
class InstanceLoad:
    id: str
    cluster: Cluster
    role: Literal["prefill", "decode"]
    outstanding: int
    """Requests dispatched to the instance and not finished there."""
    outstanding_work: float
    """Prefill: uncached tokens queued or running; decode: output tokens still to generate."""
    queue_wait_s: float = 0.0
    """Estimated real-world seconds before work sent now would start: for a prefill instance
    the T_prefill of each request it has outstanding, summed; 0 for a decode instance."""
    state: InstanceState = "ok"
    hardware: str | None = None


@quick_init
@dataclass(frozen=True)
class RequestView:
    id: str
    input_tokens: int
    output_tokens: int
    cached_local: int = 0
    """Longest cached prefix of the request in the local PD cluster (tokens)."""
    cached_prfaas: int = 0
    kv_bytes: float = 0.0
    """Real-world KVCache bytes the request would move across the link if prefilled on
    PrfaaS (S_kv of its input length)."""


@quick_init
@dataclass(frozen=True)
class LinkView:
    """The cross-datacenter link as the short-term loop sees it from the senders' counters,
    as of its last tick (scheduler.loops). The loop samples the link for every policy that
    re-plans or declares `link_view` (`measures_link`), whatever its fallback; a None field
    was not measured (yet, or at all): never a 0 that would read as an idle link."""

    bandwidth_bps: float | None
    """Estimated bandwidth the link offers, real-world bytes/s (scheduler.bandwidth). A loop
    that re-plans starts from the configured bandwidth (what it plans with before the first
    measurement); one that only measures says None until its second sample gives a rate."""
    in_flight_bytes: float | None
    """Real-world KV bytes sent or queued by the PrfaaS senders and not yet acknowledged, at
    the last sample (never negative). A loop that re-plans starts from 0 (its starting
    belief, as for the bandwidth); one that only measures says None until its first sample."""
    delivered_bps: float | None
    """Real-world bytes/s acknowledged between the last two samples (None before there are
    two)."""
    rtt_s: float | None
    """Round-trip time the deployment configures for the link (real-world seconds)."""
    scarce: bool
    """The short-term loop's verdict: bandwidth is scarce (scheduler.shortterm)."""


Knots = tuple[tuple[float, ...], tuple[float, ...]]


@dataclass(frozen=True)
class CostModel:
    """The model profile's cost curves as the policy may use them: T_prefill of each cluster's
    hardware and S_kv, as their knots (piecewise-linear, extrapolated linearly)."""

    prefill_knots: Mapping[str, Knots]
    """Per cluster name: (input tokens, real-world seconds) of T_prefill on its hardware."""
    kv_knots: Knots
    """(input tokens, real-world bytes) of S_kv."""
    kv_state_bytes: float = 0.0
    """The fixed part of S_kv (linear-attention states): S_kv never goes below it."""
    _prefill: dict[str, Curve] = field(init=False, repr=False, compare=False)
    _kv: Curve = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # made once, with the model: `prefill_s` and `kv_bytes` run a few times per decision
        # and per dispatch (object.__setattr__: the dataclass is frozen)
        prefill = {c: Curve(*k) for c, k in self.prefill_knots.items()}
        object.__setattr__(self, "_prefill", prefill)
        object.__setattr__(self, "_kv", Curve(*self.kv_knots))

    @classmethod
    def of(cls, model: ModelProfile, hardware: Mapping[str, str]) -> CostModel:
        """The curves of `model` on the hardware of each cluster (cluster -> hardware name)."""
        knots = {c: (model.prefill[h].xs, model.prefill[h].ys) for c, h in hardware.items()}
        kv = model.kv_bytes_curve
        return cls(knots, (kv.xs, kv.ys), model.state_bytes)

    def prefill_s(self, cluster: str, tokens: float) -> float:
        """T_prefill of `tokens` uncached tokens on `cluster`'s hardware (KeyError if none)."""
        if tokens <= 0:
            return 0.0
        s = self._prefill[cluster](tokens)
        return 0.0 if s < 0.0 else s  # max(s, 0.0) without the call (several per decision)

    def kv_bytes(self, tokens: float) -> float:
        """S_kv of `tokens` input tokens."""
        if tokens <= 0:
            return 0.0
        b, state = self._kv(tokens), self.kv_state_bytes
        return state if state > b else b  # max(b, state) without the call


class LoadIndex(Protocol):
    """What a snapshot asks of the load book that made it (testbed.policy.book)."""

    def least(
        self, cluster: Cluster | None, role: str, exclude: frozenset[str]
    ) -> InstanceLoad | None: ...

    def changed_since(self, version: int, exclude: frozenset[str]) -> tuple[InstanceLoad, ...]: ...


@quick_init
@dataclass(frozen=True)
class Snapshot:
    """What the policy sees at one decision. A snapshot the router or the simulator hands out
    reads their live load book: valid during the `decide` call it was made for."""

    now: float
    instances: Sequence[InstanceLoad]
    """Every instance (not excluded for this request) with its load and state; only those in
    state "ok" may be routed to. Built on first access from a book-backed snapshot."""
    threshold_tokens: float | None = None
    """The threshold currently in force (from the scenario or the planner)."""
    bandwidth_scarce: bool = False
    """The short-term loop judges the cross-datacenter link scarce (see scheduler.shortterm)."""
    link: LinkView | None = None
    """None on a deployment without a cross-datacenter link."""
    costs: CostModel | None = None
    version: int = 0
    """Counts changes of any instance's load or state: `changed_since(v)` gives what moved."""
    index: LoadIndex | None = field(default=None, repr=False, compare=False)
    exclude: frozenset[str] = frozenset()
    """Instance ids or cluster names this request must not use (it failed there)."""

    def least_loaded(self, cluster: Cluster | None, role: str) -> InstanceLoad:
        """The instance of `role` in state ok (in `cluster`, if given) with the least outstanding
        work, then fewest requests, then smallest id; LookupError if there is none."""
        if self.index is not None:
            best = self.index.least(cluster, role, self.exclude)
        else:
            candidates = [
                i
                for i in self.instances
                if i.role == role and i.state == "ok" and (cluster is None or i.cluster == cluster)
            ]
            best = (
                min(candidates, key=lambda i: (i.outstanding_work, i.outstanding, i.id))
                if candidates
                else None
            )
        if best is None:
            where = f" in cluster {cluster!r}" if cluster else ""
            raise LookupError(f"no {role} instance{where}")
        return best

    def least(self, cluster: Cluster | None, role: str) -> InstanceLoad | None:
        """`least_loaded`, or None if there is none: for a policy that weighs both clusters
        and asks three times a decision (straight to the load book, no exception raised)."""
        if self.index is not None:
            return self.index.least(cluster, role, self.exclude)
        try:
            return self.least_loaded(cluster, role)
        except LookupError:
            return None

    def changed_since(self, version: int) -> tuple[InstanceLoad, ...]:
        """The instances whose load or state changed after `version` (all of them for a
        hand-made snapshot): what a delta encoding sends."""
        if self.index is None or version <= 0:
            return tuple(self.instances)
        return self.index.changed_since(version, self.exclude)


@quick_init
@dataclass(frozen=True)
class Route:
    prefill_cluster: Cluster
    prefill_instance: str
    decode_instance: str
    uncached_tokens: int
    threshold_tokens: float | None = None
    """The length threshold this route applied (tokens), if the policy routes by one: the
    request record keeps it, and for an outside policy the report plots it as the policy's
    threshold (an HTTP answer's `route.threshold_tokens`; testbed.policy.protocol)."""
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
    # Optional fact (read by `measures_link`, so classes written before it need not say it):
    # link_view: ClassVar[bool] = False
    #     The policy reads `snapshot.link`: the router runs the short-term loop's link
    #     sampling for it even when it does not re-plan (the threshold then stays the
    #     scenario's). Every HTTP policy declares it (testbed.policy.http).
    # config: ClassVar[type[PolicyKnobs]]
    #     Its knobs' model, as a fault names its entry's (testbed/policy/predict.py): the
    #     scenario's `policy.<config.section>`, handed to `from_config` (testbed.config.policy).

    def decide(self, request: RequestView, snapshot: Snapshot) -> Route: ...


_FACTS = ("needs_threshold", "replans", "long_term", "cache_aware")
LINK_VIEW = "link_view"
"""The optional fact a policy class may declare (see `Policy` and `measures_link`)."""
CONFIG = "config"
"""The optional model of a policy's knobs (a `PolicyKnobs`, section `policy.<section>`), which
its `from_config` reads with `PolicyConfig.knobs`."""


def measures_link(cls: type[Policy]) -> bool:
    """Whether the router samples the link for `cls`'s snapshots (the short-term loop runs):
    it re-plans (the loop measures for its own planning), or it declares `link_view = True`.
    A class that declares neither keeps the loops off, so the built-ins that do not read the
    link (prfaas-static, naive, homogeneous) run exactly as before; prfaas-predict reads it
    and already re-plans."""
    return bool(cls.replans) or getattr(cls, LINK_VIEW, False) is True


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
    if not isinstance(getattr(cls, LINK_VIEW, False), bool):
        raise TypeError(f"{label}: class attribute {LINK_VIEW!r} must be True or False")
    if not callable(getattr(cls, "decide", None)):
        raise TypeError(f"{label}: needs a decide(request, snapshot) method")
    knobs = getattr(cls, CONFIG, None)
    if knobs is not None:
        if not (isinstance(knobs, type) and issubclass(knobs, PolicyKnobs)):
            raise TypeError(f"{label}: class attribute {CONFIG!r} must be a PolicyKnobs model")
        if not callable(getattr(cls, "from_config", None)):
            raise TypeError(f"{label}: has a {CONFIG!r} but no from_config(policy_config)")
        POLICY_KNOBS.register(knobs)  # its section joins every scenario's `policy:`


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
    """The instance of `role` (in `cluster`, if given) with the least outstanding work
    (`Snapshot.least_loaded`)."""
    return snapshot.least_loaded(cluster, role)
