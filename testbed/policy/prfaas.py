"""The PrfaaS policy: length threshold from the short-term loop plus the paper's cache-aware rule.

With l_total input tokens and cached prefixes l_pd (local) and l_prfaas (PrfaaS):
- bandwidth scarce: judge each cluster alone. l_total - l_pd <= t -> PD-P (reusing the local
  cache); otherwise PrfaaS, reusing what PrfaaS has cached.
- bandwidth abundant: use the best prefix anywhere, l = l_total - max(l_pd, l_prfaas);
  l <= t -> PD-P, else PrfaaS; when the longest prefix sits in the other cluster, the route asks
  for it to be pulled across before prefill.
The threshold and the scarcity flag come from the snapshot, so the policy stays a pure function;
`prfaas-nocache` is the same with every cache ignored (the cache-blind ablation).
"""

from __future__ import annotations

from typing import ClassVar

from testbed.config import DeploymentKind
from testbed.policy.base import POLICIES, Cluster, RequestView, Route, Snapshot
from testbed.policy.static import _route


@POLICIES.register
class Prfaas:
    name: ClassVar[str] = "prfaas"
    deployment_kind: ClassVar[DeploymentKind] = "prfaas-pd"
    needs_threshold: ClassVar[bool] = True
    replans: ClassVar[bool] = True
    long_term: ClassVar[bool] = True
    """The router also runs the long-term loop (role conversion) for this policy."""
    cache_aware: ClassVar[bool] = True

    def decide(self, request: RequestView, snapshot: Snapshot) -> Route:
        t = snapshot.threshold_tokens
        if t is None:
            raise ValueError(f"{self.name} needs a threshold in the snapshot")
        total = request.input_tokens
        if self.cache_aware:  # the request as it is (`_route` reads its lengths only)
            local, remote, view = request.cached_local, request.cached_prfaas, request
        else:
            local, remote = 0, 0
            view = RequestView(request.id, total, request.output_tokens, local, remote)
        if snapshot.bandwidth_scarce or not self.cache_aware:
            cluster: Cluster = "local" if total - local <= t else "prfaas"
            return _route(view, snapshot, cluster, t)
        best = max(local, remote)
        cluster = "local" if total - best <= t else "prfaas"
        here = local if cluster == "local" else remote
        pull = best - here if best > here else 0
        if pull:
            # The prefix is pulled across before prefill, so prefill starts from `best`.
            view = RequestView(
                request.id, total, request.output_tokens,
                best if cluster == "local" else local, best if cluster == "prfaas" else remote,
            )  # fmt: skip
        route = _route(view, snapshot, cluster, t)
        if pull and route.prefill_cluster == cluster:
            return Route(
                route.prefill_cluster, route.prefill_instance, route.decode_instance,
                route.uncached_tokens, t, pull_prefix_tokens=pull,
            )  # fmt: skip
        return route


@POLICIES.register
class PrfaasNoCache(Prfaas):
    """`prfaas` with every cache ignored (the cache-blind ablation); both scheduler loops run."""

    name: ClassVar[str] = "prfaas-nocache"
    cache_aware: ClassVar[bool] = False


@POLICIES.register
class PrfaasNoLongTerm(Prfaas):
    """`prfaas` without the long-term loop: the PD split stays as started (the ablation that
    shows what role conversion buys). The routing rule is the same."""

    name: ClassVar[str] = "prfaas-nolongterm"
    long_term: ClassVar[bool] = False
