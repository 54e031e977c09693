"""`prfaas-predict`: route each request where its first token is predicted to come out first.

The paper's rule compares one number, the uncached length, with one threshold t; the short-term
loop then moves t as the link changes. Moving t moves every request between the old and the new
value at once, whatever the queues hold, and the loop saws (issue #18). This policy predicts,
per request, the time to first token on each prefill option from what the snapshot says now and
takes the earliest:

- PD-P (local): the queue ahead on the least-loaded PD-P instance (`queue_wait_s`) plus
  T_prefill of the request's locally uncached tokens on the local hardware;
- PrfaaS: the queue ahead on the least-loaded PrfaaS instance plus T_prefill on the PrfaaS
  hardware, then the KV transfer: the link must first carry what is ahead of the request (the
  bytes in flight, and the KV the PrfaaS queues will emit before it) and then the request's own
  KV, at the short-term loop's bandwidth estimate times `link_headroom`; plus one RTT.

Within a cluster of identical hardware the queue wait is monotone in the load, so the
least-loaded instance of each cluster (`Snapshot.least_loaded`, O(log n)) is the best option
there: a decision is two lookups for prefill and one for decode, whatever the cluster size. The
decode instance is the one with the most admission room (least outstanding decode work); it is
the same whichever prefill option wins, so it does not enter the comparison.

Where the prediction cannot be trusted, the paper's threshold decides (the guard): the link
estimate is cold (no bandwidth yet), the snapshot carries no cost curves, or the instance the
prediction would use is not in state "ok" (suspect). Parameters: `PredictConfig`
(testbed/config/policy.py), their reasons in docs/scheduler.md.
"""

from __future__ import annotations

from typing import ClassVar

from testbed.config import DeploymentKind
from testbed.config.policy import PredictConfig
from testbed.policy.base import (
    POLICIES,
    Cluster,
    CostModel,
    InstanceLoad,
    LinkView,
    RequestView,
    Route,
    Snapshot,
)

__all__ = ["Prediction", "PrfaasPredict", "predict"]


class Prediction:
    """Predicted first-token time (seconds from now, real-world) of each prefill option; inf
    where the option does not exist. Kept for tests and the bench's explanations."""

    __slots__ = ("local", "prfaas", "transfer_s")

    def __init__(self, local: float, prfaas: float, transfer_s: float) -> None:
        self.local = local
        self.prfaas = prfaas
        self.transfer_s = transfer_s
        """The PrfaaS option's link part (waiting behind what is ahead, then its own KV)."""

    def __repr__(self) -> str:
        return f"Prediction(local={self.local:.3f}, prfaas={self.prfaas:.3f})"


def _ok(inst: InstanceLoad | None) -> bool:
    return inst is not None and inst.state == "ok"


def _lookup(snapshot: Snapshot, cluster: Cluster, role: str) -> InstanceLoad | None:
    try:
        return snapshot.least_loaded(cluster, role)
    except LookupError:
        return None


def predict(
    request: RequestView,
    local: InstanceLoad | None,
    prfaas: InstanceLoad | None,
    costs: CostModel,
    link: LinkView,
    config: PredictConfig,
    n_prfaas: int = 1,
) -> Prediction:
    """First-token time of `request` on each option (see the module docstring); `n_prfaas` is
    the number of PrfaaS prefill instances whose queues feed the link alongside ours."""
    inf = float("inf")
    t_local = inf
    if local is not None:
        uncached = max(request.input_tokens - request.cached_local, 0)
        t_local = local.queue_wait_s + costs.prefill_s("local", uncached)
    t_prfaas, transfer = inf, inf
    bw = link.bandwidth_bps
    if prfaas is not None and bw is not None and bw > 0:
        uncached = max(request.input_tokens - request.cached_prfaas, 0)
        prefill_done = prfaas.queue_wait_s + costs.prefill_s("prfaas", uncached)
        kv = request.kv_bytes
        if kv <= 0:  # the router did not say: the KV of what the local side lacks
            kv = costs.kv_bytes(max(request.input_tokens - request.cached_local, 0))
        usable = bw * config.link_headroom
        ahead = link.in_flight_bytes
        if config.count_queued_kv and prfaas.outstanding_work > 0:
            # The PrfaaS queues emit their KV onto the same link before ours; the least-loaded
            # queue stands for each of them (the others hold at least as much).
            ahead += n_prfaas * costs.kv_bytes(prfaas.outstanding_work)
        link_free = ahead / usable
        own = kv / usable
        rtt = link.rtt_s or 0.0
        # KV leaves layer by layer during the prefill, so only what the link cannot absorb by
        # the time the prefill ends (its backlog, then our bytes) adds to the prefill.
        done = max(prefill_done, link_free) + own + rtt
        t_prfaas, transfer = done, done - prefill_done
    return Prediction(t_local, t_prfaas, transfer)


@POLICIES.register
class PrfaasPredict:
    """Earliest predicted first token; the paper's threshold where predictions are stale."""

    name: ClassVar[str] = "prfaas-predict"
    deployment_kind: ClassVar[DeploymentKind] = "prfaas-pd"
    needs_threshold: ClassVar[bool] = True
    """The guard routes by t (and the planner's t sizes the long-term loop's decisions)."""
    replans: ClassVar[bool] = True
    """The short-term loop keeps the link estimate (and t, for the guard) in the snapshot."""
    long_term: ClassVar[bool] = True
    cache_aware: ClassVar[bool] = True
    """Predictions charge each cluster only the tokens its own cache lacks."""

    def __init__(self, config: PredictConfig | None = None) -> None:
        self.config = config if config is not None else PredictConfig()
        self._count_at = -float("inf")
        self._n_prfaas = 1
        self.guarded = 0
        """Decisions the threshold made (stale predictions); for tests and the bench."""
        self.predicted = 0

    def _prfaas_count(self, snapshot: Snapshot) -> int:
        """PrfaaS prefill instances in state ok, recounted at most every `recount_s` of
        snapshot time: a scan is O(n), a decision must not be, and the count rarely moves."""
        if snapshot.now - self._count_at >= self.config.recount_s or snapshot.now < self._count_at:
            self._count_at = snapshot.now
            self._n_prfaas = max(
                1,
                sum(
                    1
                    for i in snapshot.instances
                    if i.cluster == "prfaas" and i.role == "prefill" and i.state == "ok"
                ),
            )
        return self._n_prfaas

    def decide(self, request: RequestView, snapshot: Snapshot) -> Route:
        decode = _lookup(snapshot, "local", "decode")
        if decode is None:
            raise LookupError("no decode instance in cluster 'local'")
        local = _lookup(snapshot, "local", "prefill")
        prfaas = _lookup(snapshot, "prfaas", "prefill")
        if local is None and prfaas is None:
            raise LookupError("no prefill instance")
        t = snapshot.threshold_tokens
        costs, link = snapshot.costs, snapshot.link
        stale = (
            costs is None
            or link is None
            or link.bandwidth_bps is None
            or (local is not None and not _ok(local))
            or (prfaas is not None and not _ok(prfaas))
            or not _ok(decode)
        )
        if stale or local is None or prfaas is None:
            self.guarded += 1
            return self._guard(request, snapshot, local, prfaas, decode, t)
        assert costs is not None and link is not None
        p = predict(
            request, local, prfaas, costs, link, self.config, self._prfaas_count(snapshot)
        )
        self.predicted += 1
        cluster: Cluster = "prfaas" if p.prfaas < p.local else "local"
        return self._route(request, cluster, local if cluster == "local" else prfaas, decode, t)

    def _guard(
        self,
        request: RequestView,
        snapshot: Snapshot,
        local: InstanceLoad | None,
        prfaas: InstanceLoad | None,
        decode: InstanceLoad,
        t: float | None,
    ) -> Route:
        """The paper's rule with the threshold in force (cache-blind: a stale view is no time
        to pull prefixes), onto whichever cluster still has an instance."""
        if t is None:
            raise ValueError(f"{self.name} needs a threshold in the snapshot")
        uncached = request.input_tokens - request.cached_local
        cluster: Cluster = "prfaas" if uncached > t else "local"
        if cluster == "prfaas" and (prfaas is None or not _ok(prfaas)) and _ok(local):
            cluster = "local"
        elif cluster == "local" and (local is None or not _ok(local)) and _ok(prfaas):
            cluster = "prfaas"
        inst = local if cluster == "local" else prfaas
        if inst is None:  # only a suspect instance in the other cluster is left: use it
            cluster = "prfaas" if cluster == "local" else "local"
            inst = local if cluster == "local" else prfaas
        assert inst is not None
        return self._route(request, cluster, inst, decode, t)

    @staticmethod
    def _route(
        request: RequestView,
        cluster: Cluster,
        prefill: InstanceLoad,
        decode: InstanceLoad,
        t: float | None,
    ) -> Route:
        cached = request.cached_local if cluster == "local" else request.cached_prfaas
        return Route(
            prefill_cluster=cluster,
            prefill_instance=prefill.id,
            decode_instance=decode.id,
            uncached_tokens=max(request.input_tokens - cached, 0),
            threshold_tokens=t,
        )
