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
prediction would use is not in state "ok" (suspect). Parameters: `PredictConfig` (below, the
scenario's `policy.predict`), their reasons in docs/scheduler.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar, Literal

from pydantic import Field

from testbed.config import DeploymentKind, PositiveDuration
from testbed.config.policy import PolicyConfig, PolicyKnobs
from testbed.frozen import quick_init
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

__all__ = ["PredictConfig", "Prediction", "PrfaasPredict", "predict"]


class PredictConfig(PolicyKnobs):
    """`prfaas-predict`'s knobs, the scenario's `policy.predict` (defaults justified in
    docs/scheduler.md)."""

    section: ClassVar[str] = "predict"

    link_headroom: float = Field(0.9, gt=0, le=1)
    """Share of the estimated bandwidth a new transfer is predicted to get."""
    backlog_s: PositiveDuration = 0.5
    """A link backlog this long at the delivered rate makes the delivered rate the prediction's
    bandwidth (the estimate lags a drop by seconds)."""
    count_queued_kv: bool = True
    """Count the KV of every request outstanding on PrfaaS as ahead on the link, not only the
    bytes already sent."""
    busy_weight: float = Field(0.0, ge=0)
    """Weight of the time an option keeps its resource busy (T_prefill on PD-P; the larger of
    T_prefill on PrfaaS and the KV's time on the link) added to the predicted first token:
    what a request costs the ones that arrive after it."""
    min_bandwidth_share: float = Field(0.05, ge=0, le=1)
    """Least share of the highest estimate seen that predictions believe in: a black hole's
    estimate falls to zero, yet it heals, and what waits for the link then crosses at once."""
    pull_prefixes: bool = True
    """Weigh pulling a prefix cached in PrfaaS before a PD-P prefill (abundant link only)."""
    ttft_target: PositiveDuration | None = 10.0
    """A request predicted to miss this on both options goes where it keeps a resource busy
    for less; None: always the earliest first token."""
    triage_slack: float | None = Field(None, ge=1)
    """... if its first token there is predicted at most this factor later than on the other
    (None: whatever the factor)."""
    triage_weight: float | None = Field(None, gt=0)
    """... or, with a weight k, where its predicted first token plus k x that share is least
    (while the link is not narrowed below half its nominal rate): a dial from SLO attainment
    and saturation throughput (None: the smaller share outright) towards P90 TTFT (small k);
    bench/reports/scheduler.md measures it."""
    local_reserve: float | None = Field(None, gt=0)
    """While PrfaaS is predicted to miss `ttft_target`, a request whose locally uncached tokens
    exceed this share of the threshold in force does not take PD-P: PD-P's on-time capacity
    goes to short prompts, as the paper's rule keeps them (None: no reserve). With
    `triage_weight` it keeps most of the SLO attainment the dial gives up on cache-skew
    (docs/scheduler.md, "The local reserve")."""
    recount_s: PositiveDuration = 1.0
    """Real-world seconds between sums of the PrfaaS queues' KV (an O(n) scan)."""
    busy_rate: Literal["nominal", "current"] = "nominal"
    """The link rate the PrfaaS option's busy share (triage, `busy_weight`) divides its KV by:
    the link's nominal rate (the highest estimate seen: a narrowed link's backlog clears at it
    once the link heals) or the current estimate (the rate the prediction uses)."""


@quick_init
@dataclass(frozen=True)
class Prediction:
    """What `predict` says of one request: first-token time (seconds from now, real-world) on
    each prefill option (inf where the option does not exist) and the share of its cluster's
    capacity each option takes, in seconds (what the request costs the ones arriving after it).
    """

    local: float
    prfaas: float
    local_busy: float = 0.0
    """T_prefill on PD-P over the number of PD-P instances."""
    prfaas_busy: float = 0.0
    """The larger of T_prefill on PrfaaS over the number of PrfaaS instances and the KV's time
    on the link (one link: all of its capacity) at the rate `PredictConfig.busy_rate` names."""
    pull_tokens: int = 0
    """Prefix pulled from PrfaaS before a PD-P prefill (the local option's plan), 0 if none."""


def _ok(inst: InstanceLoad | None) -> bool:
    return inst is not None and inst.state == "ok"


def link_rate(link: LinkView, config: PredictConfig, floor: float = 0.0) -> float | None:
    """Bytes/s a new transfer is predicted to get: the short-term loop's estimate, or the rate
    the link delivered if a backlog of `backlog_s` stands in front of it (the estimate follows
    a drop within seconds; a standing queue shows it at once), never below `floor` (a black
    hole's estimate falls to zero, but it heals: see `min_bandwidth_share`), times
    `link_headroom`. None while the estimator is cold."""
    bw = link.bandwidth_bps
    if bw is None:
        return None
    delivered = link.delivered_bps
    # min() and max() written out, here and in `predict`: the builtins' calls cost more than
    # the arithmetic, a few times per decision
    if (
        delivered
        and delivered > 0
        and (link.in_flight_bytes or 0.0) > delivered * config.backlog_s
        and delivered < bw
    ):
        bw = delivered
    if floor > bw:
        bw = floor
    return bw * config.link_headroom if bw > 0 else None


def predict(
    request: RequestView,
    local: InstanceLoad | None,
    prfaas: InstanceLoad | None,
    costs: CostModel,
    link: LinkView,
    config: PredictConfig,
    pending_kv: float = 0.0,
    floor_bps: float = 0.0,
    n_local: int = 1,
    n_prfaas: int = 1,
    nominal_bps: float = 0.0,
) -> Prediction:
    """First-token time of `request` on each option (see the module docstring). `pending_kv`:
    real-world KV bytes of every request outstanding on PrfaaS (sent, in flight or still to be
    computed), which the link carries before or alongside this request's; `floor_bps`: the
    least bandwidth to believe in (`link_rate`); `n_local`, `n_prfaas`: prefill instances in
    each cluster (the busy shares); `nominal_bps`: the link's nominal rate (the highest
    estimate seen), which the busy share uses when `busy_rate` is "nominal"."""
    inf = math.inf
    bw = link_rate(link, config, floor_bps)
    rtt = link.rtt_s or 0.0
    ahead = link.in_flight_bytes or 0.0
    if config.count_queued_kv and pending_kv > ahead:
        ahead = pending_kv
    # Counted whole although the link shares its rate among transfers (a short KV passes a long
    # one): a transfer also slows every other one by its own size, so charging the backlog to
    # each newcomer keeps short prompts off a narrow link (tried: charging at most n x its own
    # size sent more short prompts across and raised P90 TTFT, see docs/scheduler.md).
    # (prefill_s and kv_bytes are 0 for a length <= 0: no clamp needed before them)
    tokens, cached_local = request.input_tokens, request.cached_local
    cached_prfaas = request.cached_prfaas
    t_local = busy_local = inf
    pull = 0
    if local is not None:
        shares = n_local if n_local >= 1 else 1
        own = costs.prefill_s("local", tokens - cached_local)
        t_local, busy_local = local.queue_wait_s + own, own / shares
        extra = cached_prfaas - cached_local
        if config.pull_prefixes and extra > 0 and bw is not None and not link.scarce:
            # the paper's cache-aware rule on an abundant link, as a third option: pull the
            # longer prefix across, then prefill the rest locally
            rest = costs.prefill_s("local", tokens - cached_prfaas)
            t_pull = (ahead + costs.kv_bytes(extra)) / bw + rtt + local.queue_wait_s + rest
            if t_pull < t_local:
                t_local, busy_local, pull = t_pull, rest / shares, extra
    t_prfaas = busy_prfaas = inf
    if prfaas is not None and bw is not None:
        compute = costs.prefill_s("prfaas", tokens - cached_prfaas)
        prefill_done = prfaas.queue_wait_s + compute
        # the KV sent is what the decode side lacks (docs/scheduler.md, "Prefix cache")
        kv = costs.kv_bytes(tokens - cached_local)
        # KV leaves layer by layer during the prefill: the link part only adds where it
        # outlasts the prefill
        link_done = (ahead + kv) / bw
        t_prfaas = (link_done if link_done > prefill_done else prefill_done) + rtt
        # what the KV costs the requests after it: a narrowed link's backlog clears at the
        # nominal rate once the link heals, while a PD-P queue at capacity never clears
        # (docs/scheduler.md, "Triage")
        busy_bw = nominal_bps if config.busy_rate == "nominal" and nominal_bps > 0 else bw
        busy_compute, busy_link = compute / (n_prfaas if n_prfaas >= 1 else 1), kv / busy_bw
        busy_prfaas = busy_link if busy_link > busy_compute else busy_compute
    return Prediction(t_local, t_prfaas, busy_local, busy_prfaas, pull)


NARROWED = 0.5
"""A link estimated below this share of its nominal rate is narrowed: there `triage_weight` is
not used and a late request goes to the smaller share outright (the link's backlog clears
when it heals; see `PredictConfig.busy_rate`)."""


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
    config: ClassVar[type[PredictConfig]] = PredictConfig
    """Its knobs: the scenario's `policy.predict`."""

    @classmethod
    def from_config(cls, config: PolicyConfig) -> PrfaasPredict:
        """The scenario's `policy.predict` knobs (testbed.policy.make_policy)."""
        return cls(config.knobs(PredictConfig))

    def __init__(self, config: PredictConfig | None = None) -> None:
        self.knobs = config if config is not None else PredictConfig()
        self._count_at = -float("inf")
        self._pending_kv = 0.0
        self._n = {"local": 1, "prfaas": 1}
        """Prefill instances in state ok per cluster, as of the last sum."""
        self._version = 0
        self._kv_sum = 0.0
        self._kv_of: dict[str, float] = {}
        self._ok_of: dict[str, str | None] = {}
        self._peak_bps = 0.0
        """The highest bandwidth estimate seen (the link's nominal rate, in practice)."""
        self.last: Prediction | None = None
        """The latest decision's prediction (for tests and the bench)."""
        self.guarded = 0
        """Decisions the threshold made (stale predictions); for tests and the bench."""
        self.predicted = 0

    def _recount(self, snapshot: Snapshot, costs: CostModel) -> None:
        """KV bytes outstanding on PrfaaS (`predict`'s `pending_kv`) and the prefill instances
        per cluster, brought up to date at most every `recount_s` of snapshot time from the
        instances that changed since (`Snapshot.changed_since`: the load book walks only those,
        so a decision never scans the deployment); the KV this policy sends to PrfaaS in
        between is added as it goes. `decide` calls it once `recount_s` has passed."""
        self._count_at = snapshot.now
        if snapshot.version <= 0 or snapshot.version < self._version:
            # a hand-made snapshot (it lists every instance) or another book: start over
            self._version, self._kv_of, self._ok_of, self._kv_sum = 0, {}, {}, 0.0
            self._n = {"local": 0, "prfaas": 0}
        n, kv_of, ok_of, kv_sum = self._n, self._kv_of, self._ok_of, self._kv_sum
        for i in snapshot.changed_since(self._version):
            iid, prefill = i.id, i.role == "prefill"
            kv = 0.0
            if prefill and i.outstanding and i.cluster == "prfaas":
                # per request: S_kv is near linear, so the mean length stands for each
                kv = i.outstanding * costs.kv_bytes(i.outstanding_work / i.outstanding)
            kv_sum += kv - kv_of.get(iid, 0.0)
            kv_of[iid] = kv
            was = ok_of.get(iid)
            now = i.cluster if prefill and i.state == "ok" else None
            if was is not None:
                n[was] -= 1
            if now is not None:
                n[now] += 1
            ok_of[iid] = now
        self._kv_sum = kv_sum
        self._version = snapshot.version
        self._pending_kv = max(kv_sum, 0.0)

    def decide(self, request: RequestView, snapshot: Snapshot) -> Route:
        least = snapshot.least
        decode = least("local", "decode")
        if decode is None:
            raise LookupError("no decode instance in cluster 'local'")
        local = least("local", "prefill")
        prfaas = least("prfaas", "prefill")
        if local is None and prfaas is None:
            raise LookupError("no prefill instance")
        t = snapshot.threshold_tokens
        costs, link = snapshot.costs, snapshot.link
        bw = None if link is None else link.bandwidth_bps
        if (
            costs is None
            or link is None
            or bw is None
            or local is None
            or prfaas is None
            or local.state != "ok"
            or prfaas.state != "ok"
            or decode.state != "ok"
        ):  # stale (see the module docstring), or one cluster has no instance
            self.guarded += 1
            return self._guard(request, local, prfaas, decode, t)
        knobs = self.knobs
        if bw > self._peak_bps:
            self._peak_bps = bw
        peak = self._peak_bps
        if not self._count_at <= snapshot.now < self._count_at + knobs.recount_s:
            self._recount(snapshot, costs)
        pending = self._pending_kv if knobs.count_queued_kv else 0.0
        n = self._n
        p = predict(request, local, prfaas, costs, link, knobs, pending,
                    knobs.min_bandwidth_share * peak, n["local"], n["prfaas"], peak)  # fmt: skip
        self.predicted += 1
        self.last = p
        uncached_local = request.input_tokens - request.cached_local
        reserve = knobs.local_reserve
        long_request = reserve is not None and t is not None and uncached_local > reserve * t
        cluster = self.choose(p, bw < NARROWED * peak, long_request)
        if cluster == "prfaas":
            self._pending_kv += costs.kv_bytes(uncached_local)
            return self._route(request, cluster, prfaas, decode, t)
        route = self._route(request, cluster, local, decode, t)
        if p.pull_tokens:
            return replace(route, uncached_tokens=request.input_tokens - request.cached_prfaas,
                           pull_prefix_tokens=p.pull_tokens)  # fmt: skip
        return route

    def choose(self, p: Prediction, narrowed: bool = False, long_request: bool = False) -> Cluster:
        """The option whose first token comes first, plus `busy_weight` x the share of its
        cluster it takes; a request that misses `ttft_target` on both goes where it takes the
        smaller share (it is late anyway; the ones behind it need not be), or, with
        `triage_weight` k and a link that is not `narrowed`, where its first token plus k x
        its share is least. A `long_request` (past `local_reserve` x t) goes to PrfaaS
        whenever PrfaaS is late: under overload PD-P's on-time capacity serves more requests
        if it serves short ones."""
        w, target = self.knobs.busy_weight, self.knobs.ttft_target
        if long_request and target is not None and target < p.prfaas < float("inf"):
            return "prfaas"  # inf: no bandwidth to believe in, PrfaaS is no option
        best = p.prfaas if p.prfaas < p.local else p.local  # min(), without the call
        k = None if narrowed else self.knobs.triage_weight
        if target is not None and best > target and k is not None:
            # the dial between the two: how many seconds of its own first token a late request
            # gives up per second of capacity it spares the ones behind it
            weighted_prfaas = p.prfaas + k * p.prfaas_busy
            return "prfaas" if weighted_prfaas < p.local + k * p.local_busy else "local"
        if target is not None and best > target:
            lighter: Cluster = "prfaas" if p.prfaas_busy < p.local_busy else "local"
            slack = self.knobs.triage_slack
            if slack is None or (p.prfaas if lighter == "prfaas" else p.local) <= best * slack:
                return lighter
        return "prfaas" if p.prfaas + w * p.prfaas_busy < p.local + w * p.local_busy else "local"

    def _guard(
        self,
        request: RequestView,
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


EVIDENCE: dict[str, str | tuple[str, ...]] = {
    "PredictConfig.link_headroom": (
        "tests/policy/test_predict.py::"
        "test_link_headroom_is_the_share_of_the_estimate_a_transfer_gets"
    ),
    "PredictConfig.backlog_s": (
        "tests/policy/test_predict.py::"
        "test_backlog_s_is_the_queue_that_makes_the_delivered_rate_count"
    ),
    "PredictConfig.count_queued_kv": (
        "tests/policy/test_predict.py::"
        "test_count_queued_kv_and_recount_s_decide_what_counts_as_ahead"
    ),
    "PredictConfig.busy_weight": (
        "tests/policy/test_predict.py::"
        "test_busy_weight_charges_the_time_an_option_keeps_its_resource"
    ),
    "PredictConfig.min_bandwidth_share": (
        "tests/policy/test_predict.py::test_min_bandwidth_share_is_the_floor_under_the_estimate"
    ),
    "PredictConfig.pull_prefixes": (
        "tests/policy/test_predict.py::test_pull_prefixes_off_never_pulls"
    ),
    "PredictConfig.ttft_target": (
        "tests/policy/test_predict.py::"
        "test_a_request_late_everywhere_goes_where_it_keeps_a_resource_busy_less"
    ),
    "PredictConfig.triage_slack": (
        "tests/policy/test_predict.py::"
        "test_triage_slack_bounds_how_much_later_the_lighter_option_may_be"
    ),
    "PredictConfig.triage_weight": (
        "tests/policy/test_predict.py::"
        "test_triage_weight_dials_between_the_first_token_and_the_share"
    ),
    "PredictConfig.busy_rate": (
        "tests/policy/test_predict.py::test_busy_rate_charges_the_kv_at_the_links_nominal_rate"
    ),
    "PredictConfig.local_reserve": (
        "tests/policy/test_predict.py::"
        "test_local_reserve_keeps_pd_p_for_short_prompts_while_prfaas_is_late"
    ),
    "PredictConfig.recount_s": (
        "tests/policy/test_predict.py::"
        "test_count_queued_kv_and_recount_s_decide_what_counts_as_ahead"
    ),
}
"""Evidence that each field of this module's models changes what the testbed does: the tests
(`path::function`) that show it, read by tests/test_no_silent_fields.py (a field without a
row here or there fails it)."""
