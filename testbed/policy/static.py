"""The three baseline routing policies of the paper's case study.

- homogeneous: every prefill on a local PD-P instance (one PD cluster, no link).
- naive: every prefill on PrfaaS, every decode local; no length routing.
- prfaas-static: uncached length l > t goes to PrfaaS, else PD-P, with a fixed t (from the
  scenario, or the planner's optimum when the scenario says `auto`).
Instance choice within a cluster is least outstanding work, for all three.
"""

from __future__ import annotations

from typing import ClassVar

from testbed.config import DeploymentKind
from testbed.policy.base import POLICIES, Cluster, RequestView, Route, Snapshot, least_loaded


def _route(request: RequestView, snapshot: Snapshot, cluster: Cluster, t: float | None) -> Route:
    """Least-loaded instances; if the chosen cluster has no prefill instance left (all down or
    excluded after a failure), the other cluster prefills instead."""
    try:
        prefill = least_loaded(snapshot, cluster, "prefill")
    except LookupError:
        cluster = "local" if cluster == "prfaas" else "prfaas"
        prefill = least_loaded(snapshot, cluster, "prefill")
    cached = request.cached_local if cluster == "local" else request.cached_prfaas
    decode = least_loaded(snapshot, "local", "decode")
    return Route(
        prefill_cluster=cluster,
        prefill_instance=prefill.id,
        decode_instance=decode.id,
        uncached_tokens=max(request.input_tokens - cached, 0),
        threshold_tokens=t,
    )


@POLICIES.register
class Homogeneous:
    name: ClassVar[str] = "homogeneous"
    deployment_kind: ClassVar[DeploymentKind] = "homogeneous"
    needs_threshold: ClassVar[bool] = False
    replans: ClassVar[bool] = False
    long_term: ClassVar[bool] = False
    cache_aware: ClassVar[bool] = False

    def decide(self, request: RequestView, snapshot: Snapshot) -> Route:
        return _route(request, snapshot, "local", None)


@POLICIES.register
class Naive:
    name: ClassVar[str] = "naive"
    deployment_kind: ClassVar[DeploymentKind] = "naive"
    needs_threshold: ClassVar[bool] = False
    replans: ClassVar[bool] = False
    long_term: ClassVar[bool] = False
    cache_aware: ClassVar[bool] = False

    def decide(self, request: RequestView, snapshot: Snapshot) -> Route:
        return _route(request, snapshot, "prfaas", None)


@POLICIES.register
class PrfaasStatic:
    """Length-threshold routing; the threshold comes from the snapshot (set once per run).

    Not cache-aware in the scheduler's sense: it subtracts the local cache hit from the length
    it compares with t, but never uses a prefix cached in the other cluster."""

    name: ClassVar[str] = "prfaas-static"
    deployment_kind: ClassVar[DeploymentKind] = "prfaas-pd"
    needs_threshold: ClassVar[bool] = True
    replans: ClassVar[bool] = False
    long_term: ClassVar[bool] = False
    cache_aware: ClassVar[bool] = False

    def decide(self, request: RequestView, snapshot: Snapshot) -> Route:
        t = snapshot.threshold_tokens
        if t is None:
            raise ValueError("prfaas-static needs a threshold in the snapshot")
        uncached = request.input_tokens - request.cached_local
        cluster: Cluster = "prfaas" if uncached > t else "local"
        return _route(request, snapshot, cluster, t)
