"""The three baseline routing policies of the paper's case study.

- homogeneous: every prefill on a local PD-P instance (one PD cluster, no link).
- naive: every prefill on PrfaaS, every decode local; no length routing.
- prfaas-static: uncached length l > t goes to PrfaaS, else PD-P, with a fixed t (from the
  scenario, or the planner's optimum when the scenario says `auto`).
Instance choice within a cluster is least outstanding work, for all three.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.policy.base import Cluster, RequestView, Route, Snapshot, least_loaded


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


@dataclass(frozen=True)
class Homogeneous:
    name: str = "homogeneous"

    def decide(self, request: RequestView, snapshot: Snapshot) -> Route:
        return _route(request, snapshot, "local", None)


@dataclass(frozen=True)
class Naive:
    name: str = "naive"

    def decide(self, request: RequestView, snapshot: Snapshot) -> Route:
        return _route(request, snapshot, "prfaas", None)


@dataclass(frozen=True)
class PrfaasStatic:
    """Length-threshold routing; the threshold comes from the snapshot (set once per run)."""

    name: str = "prfaas-static"

    def decide(self, request: RequestView, snapshot: Snapshot) -> Route:
        t = snapshot.threshold_tokens
        if t is None:
            raise ValueError("prfaas-static needs a threshold in the snapshot")
        uncached = request.input_tokens - request.cached_local
        cluster: Cluster = "prfaas" if uncached > t else "local"
        return _route(request, snapshot, cluster, t)
