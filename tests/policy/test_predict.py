"""`prfaas-predict` on hand-made snapshots: earliest predicted first token, the threshold as the
guard where predictions are stale, and a decision that does not scan the instances."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import pytest

from testbed.config.policy import PolicyConfig
from testbed.policy import get_policy, make_policy
from testbed.policy.base import CostModel, InstanceLoad, LinkView, RequestView, Snapshot
from testbed.policy.predict import PredictConfig, PrfaasPredict, link_rate, predict

GBPS = 1e9 / 8
# T_prefill: 2e-4 s/token on the local (PD-P) hardware, 5e-5 s/token on PrfaaS; S_kv 1e5 B/token
COSTS = CostModel(
    {"local": ((0.0, 1e5), (0.0, 20.0)), "prfaas": ((0.0, 1e5), (0.0, 5.0))},
    ((0.0, 1e5), (0.0, 1e10)),
)
FAST = LinkView(100 * GBPS, 0.0, None, 0.02, False)


def inst(
    iid: str, cluster: str, role: str, work: float = 0.0, wait: float = 0.0, state: str = "ok"
) -> InstanceLoad:
    return InstanceLoad(iid, cluster, role, int(work > 0), work, wait, state)  # type: ignore[arg-type]


def snap(
    *extra: InstanceLoad,
    local_wait: float = 0.0,
    prfaas_wait: float = 0.0,
    link: LinkView | None = FAST,
    costs: CostModel | None = COSTS,
    t: float | None = 20_000,
    instances: Sequence[InstanceLoad] | None = None,
    now: float = 0.0,
) -> Snapshot:
    base = (
        inst("local-p", "local", "prefill", 1 if local_wait else 0, local_wait),
        inst("prfaas-p", "prfaas", "prefill", 1 if prfaas_wait else 0, prfaas_wait),
        inst("local-d", "local", "decode"),
    )
    return Snapshot(
        now=now,
        instances=instances if instances is not None else base + extra,
        threshold_tokens=t,
        link=link,
        costs=costs,
    )


def req(tokens: int, *, local: int = 0, prfaas: int = 0) -> RequestView:
    return RequestView("r", tokens, 100, local, prfaas, COSTS.kv_bytes(tokens))


def test_registered_with_the_facts_the_runner_reads() -> None:
    cls = get_policy("prfaas-predict")
    assert cls is PrfaasPredict
    assert (cls.deployment_kind, cls.needs_threshold, cls.replans, cls.long_term) == (
        "prfaas-pd",
        True,
        True,
        True,
    )
    assert make_policy("prfaas-predict").name == "prfaas-predict"


def test_long_prompts_go_to_prfaas_on_an_idle_fast_link() -> None:
    route = PrfaasPredict().decide(req(50_000), snap())
    # local 10 s against PrfaaS 2.5 s + 5 GB at 90% of 100 Gbps (0.44 s) + RTT
    assert (route.prefill_cluster, route.prefill_instance) == ("prfaas", "prfaas-p")
    assert route.decode_instance == "local-d"


def test_a_busy_prfaas_queue_keeps_short_prompts_local() -> None:
    # 3 s of queue on PrfaaS: 5K tokens take 1 s locally, 3.25 s + transfer on PrfaaS
    route = PrfaasPredict().decide(req(5_000), snap(prfaas_wait=3.0))
    assert route.prefill_cluster == "local"


def test_the_crossover_moves_with_the_queues() -> None:
    """The policy's implicit threshold is where T_local(l) - T_prfaas(l) equals the queue
    difference: a longer PD-P queue sends shorter prompts across."""
    policy = PrfaasPredict()
    calm = snap(prfaas_wait=2.0)
    busy_local = snap(prfaas_wait=2.0, local_wait=4.0)
    assert policy.decide(req(12_000), calm).prefill_cluster == "local"
    assert policy.decide(req(12_000), busy_local).prefill_cluster == "prfaas"


def test_a_narrow_link_with_a_backlog_keeps_long_prompts_local() -> None:
    narrow = LinkView(5 * GBPS, 5e9, None, 0.02, True)
    route = PrfaasPredict().decide(req(50_000), snap(link=narrow))
    # PrfaaS: 5 GB ahead + 5 GB own at 90% of 5 Gbps = 17.8 s; local: 10 s
    assert route.prefill_cluster == "local"
    idle = snap()
    local, prfaas = idle.least_loaded("local", "prefill"), idle.least_loaded("prfaas", "prefill")
    p = predict(req(50_000), local, prfaas, COSTS, narrow, PredictConfig())
    assert p.local == pytest.approx(10.0)
    assert p.prfaas == pytest.approx(2 * 5e9 / (0.9 * 5 * GBPS) + 0.02)


def test_kv_the_prfaas_queues_will_emit_counts_as_ahead_on_the_link() -> None:
    narrow = LinkView(5 * GBPS, 0.0, None, 0.0, True)
    busy = inst("prfaas-p", "prfaas", "prefill", 20_000, 1.0)
    local = inst("local-p", "local", "prefill")
    counted = predict(req(30_000), local, busy, COSTS, narrow, PredictConfig(), pending_kv=2e9)
    ignored = predict(
        req(30_000), local, busy, COSTS, narrow, PredictConfig(count_queued_kv=False), 2e9
    )
    usable = 0.9 * 5 * GBPS
    assert ignored.prfaas == pytest.approx(max(2.5, 3e9 / usable))  # 1 s queue + 1.5 s prefill
    assert counted.prfaas == pytest.approx((2e9 + 3e9) / usable)


def test_the_policy_counts_the_kv_it_sent_across_since_the_last_sum() -> None:
    narrow = LinkView(5 * GBPS, 0.0, None, 0.0, True)
    policy = PrfaasPredict(PredictConfig(ttft_target=None))
    first = policy.decide(req(60_000), snap(link=narrow))
    assert first.prefill_cluster == "prfaas"  # 6 GB alone: 12 s against 12 s local... and less
    # the same request again at the same instant: now 6 GB of its own KV is ahead of it
    assert policy.decide(req(60_000), snap(link=narrow)).prefill_cluster == "local"


def test_a_backlog_makes_the_delivered_rate_the_bandwidth() -> None:
    lagging = LinkView(100 * GBPS, 2e9, 5 * GBPS, 0.0, False)  # 3.2 s of backlog at 5 Gbps
    assert link_rate(lagging, PredictConfig()) == pytest.approx(0.9 * 5 * GBPS)
    idle = LinkView(100 * GBPS, 0.0, 5 * GBPS, 0.0, False)  # no backlog: the link is not full
    assert link_rate(idle, PredictConfig()) == pytest.approx(0.9 * 100 * GBPS)


def test_a_black_hole_is_believed_at_the_floor_not_at_zero() -> None:
    hole = LinkView(0.0, 5e9, 0.0, 0.0, True)
    assert link_rate(hole, PredictConfig()) is None
    assert link_rate(hole, PredictConfig(), floor=5 * GBPS) == pytest.approx(0.9 * 5 * GBPS)
    policy = PrfaasPredict(PredictConfig(ttft_target=None))
    policy.decide(req(1_000), snap())  # sees 100 Gbps: the floor is 5% of it
    route = policy.decide(req(100_000), snap(link=hole, local_wait=30.0))
    assert route.prefill_cluster == "prfaas" and policy.last is not None
    assert policy.last.prfaas < policy.last.local < float("inf")


def test_a_prefix_cached_in_prfaas_is_pulled_on_an_abundant_link() -> None:
    route = PrfaasPredict().decide(req(50_000, prfaas=45_000), snap(prfaas_wait=8.0))
    assert route.prefill_cluster == "local"
    assert route.pull_prefix_tokens == 45_000 and route.uncached_tokens == 5_000
    scarce = LinkView(100 * GBPS, 0.0, None, 0.02, True)
    route = PrfaasPredict().decide(req(50_000, prfaas=45_000), snap(link=scarce, prfaas_wait=8.0))
    assert route.pull_prefix_tokens == 0


def test_a_request_late_everywhere_goes_where_it_keeps_a_resource_busy_less() -> None:
    # a 40K prompt is late either way: 28 s on PD-P (busy 8 s with it), 37 s on PrfaaS (busy
    # 2 s; its KV 0.36 s on the link)
    s = snap(local_wait=20.0, prfaas_wait=35.0)
    assert (
        PrfaasPredict(PredictConfig(ttft_target=None)).decide(req(40_000), s).prefill_cluster
        == "local"
    )
    assert PrfaasPredict().decide(req(40_000), s).prefill_cluster == "prfaas"
    # not when the lighter option is far later than the best and a slack bounds it
    far = snap(local_wait=20.0, prfaas_wait=80.0)
    assert _decides(PredictConfig(triage_slack=1.5), req(40_000), far) == "local"


def test_the_scenario_knobs_reach_the_policy() -> None:
    config = PolicyConfig(name="prfaas-predict", predict=PredictConfig(link_headroom=0.5))
    policy = make_policy("prfaas-predict", config)
    assert isinstance(policy, PrfaasPredict) and policy.knobs.link_headroom == 0.5
    assert make_policy("prfaas-static", config).name == "prfaas-static"  # others ignore it


def test_each_cluster_is_charged_only_what_its_cache_lacks() -> None:
    # 50K prompt, 45K cached locally: 1 s on PD-P beats 2.5 s on PrfaaS
    route = PrfaasPredict().decide(req(50_000, local=45_000), snap())
    assert route.prefill_cluster == "local"
    assert route.uncached_tokens == 5_000


@pytest.mark.parametrize(
    ("link", "costs"),
    [
        (LinkView(None, 0.0, None, None, False), COSTS),  # estimator cold
        (None, COSTS),
        (FAST, None),
    ],
    ids=["estimator-cold", "no-link-view", "no-costs"],
)
def test_stale_predictions_fall_back_to_the_threshold(
    link: LinkView | None, costs: CostModel | None
) -> None:
    policy = PrfaasPredict()
    # the threshold says local for 15K (< 20K) although PrfaaS is idle and faster
    assert policy.decide(req(15_000), snap(link=link, costs=costs)).prefill_cluster == "local"
    assert policy.decide(req(25_000), snap(link=link, costs=costs)).prefill_cluster == "prfaas"
    assert policy.guarded == 2 and policy.predicted == 0


def test_the_guard_needs_a_threshold() -> None:
    with pytest.raises(ValueError, match="threshold"):
        PrfaasPredict().decide(req(15_000), snap(costs=None, t=None))


def test_suspect_and_draining_instances_are_never_routed_to() -> None:
    instances = (
        inst("local-p", "local", "prefill", 0, 0.0, "suspect"),
        inst("local-p2", "local", "prefill", 5_000, 1.0),
        inst("prfaas-p", "prfaas", "prefill", 0, 0.0, "draining"),
        inst("prfaas-p2", "prfaas", "prefill", 9_000, 9.0),
        inst("local-d", "local", "decode", 0, 0.0, "suspect"),
        inst("local-d2", "local", "decode", 500),
    )
    route = PrfaasPredict().decide(req(5_000), snap(instances=instances))
    assert (route.prefill_instance, route.decode_instance) == ("local-p2", "local-d2")


def test_with_one_prefill_cluster_left_it_takes_everything() -> None:
    instances = (inst("local-p", "local", "prefill", 1, 100.0), inst("local-d", "local", "decode"))
    route = PrfaasPredict().decide(req(80_000), snap(instances=instances))
    assert route.prefill_cluster == "local"
    with pytest.raises(LookupError):
        PrfaasPredict().decide(req(80_000), snap(instances=instances[1:]))


def test_the_decode_instance_is_the_one_with_most_room() -> None:
    instances = (
        *snap().instances[:2],
        inst("local-d0", "local", "decode", 9_000),
        inst("local-d9", "local", "decode", 10),
    )
    route = PrfaasPredict().decide(req(5_000), snap(instances=instances))
    assert route.decode_instance == "local-d9"


class _Counting(Sequence[InstanceLoad]):
    """An instance list that counts how often a decision walks it."""

    def __init__(self, items: tuple[InstanceLoad, ...]) -> None:
        self.items = items
        self.walks = 0

    def __iter__(self) -> Iterator[InstanceLoad]:
        self.walks += 1
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    @overload
    def __getitem__(self, i: int) -> InstanceLoad: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[InstanceLoad]: ...
    def __getitem__(self, i: Any) -> Any:
        return self.items[i]


class _Index:
    """A load index as the router's book offers it (one lookup per call)."""

    def __init__(self, items: tuple[InstanceLoad, ...]) -> None:
        self.items = items
        self.calls = 0

    def least(self, cluster: str | None, role: str, exclude: frozenset[str]) -> InstanceLoad | None:
        self.calls += 1
        ok = [
            i for i in self.items
            if i.role == role and i.state == "ok" and cluster in (None, i.cluster)
        ]  # fmt: skip
        return min(ok, key=lambda i: (i.outstanding_work, i.outstanding, i.id), default=None)

    def changed_since(self, version: int, exclude: frozenset[str]) -> tuple[InstanceLoad, ...]:
        return self.items


def test_a_decision_uses_the_index_not_a_scan() -> None:
    """10,000 instances: decisions within one recount interval walk the list at most once
    (the PrfaaS count) and ask the index three lookups each."""
    items = tuple(
        inst(f"{c}-{r}-{n}", c, r, float(n))
        for c, r, count in (("prfaas", "prefill", 2500), ("local", "prefill", 2500),
                            ("local", "decode", 5000))
        for n in range(count)
    )  # fmt: skip
    seq, index = _Counting(items), _Index(items)
    policy = PrfaasPredict(PredictConfig(recount_s=1.0))
    for k in range(50):
        s = Snapshot(now=k * 0.01, instances=seq, threshold_tokens=20_000, link=FAST,
                     costs=COSTS, index=index)  # fmt: skip
        policy.decide(req(30_000 + k), s)
    assert seq.walks == 1
    assert index.calls == 3 * 50
    assert policy.predicted == 50


# ---------------------------------------------------------------- each knob changes a decision


def _decides(config: PredictConfig, request: RequestView, s: Snapshot) -> str:
    return PrfaasPredict(config).decide(request, s).prefill_cluster


def test_link_headroom_is_the_share_of_the_estimate_a_transfer_gets() -> None:
    narrow = LinkView(5 * GBPS, 0.0, None, 0.0, True)
    # 40K: local 8 s; PrfaaS max(2 s, 4 GB at 90% of 5 Gbps = 7.1 s) -> PrfaaS; at 50%: 12.8 s
    assert _decides(PredictConfig(), req(40_000), snap(link=narrow)) == "prfaas"
    assert _decides(PredictConfig(link_headroom=0.5), req(40_000), snap(link=narrow)) == "local"


def test_backlog_s_is_the_queue_that_makes_the_delivered_rate_count() -> None:
    lagging = LinkView(100 * GBPS, 2e9, 5 * GBPS, 0.0, False)  # 3.2 s at the delivered rate
    assert link_rate(lagging, PredictConfig(backlog_s=5.0)) == pytest.approx(0.9 * 100 * GBPS)
    assert link_rate(lagging, PredictConfig(backlog_s=1.0)) == pytest.approx(0.9 * 5 * GBPS)


def test_busy_weight_charges_the_time_an_option_keeps_its_resource() -> None:
    # 10K: PD-P 2 s (busy 2 s); PrfaaS 2.5 s queue + 0.5 s (busy 0.5 s) + KV at 90 Gbps
    s = snap(prfaas_wait=2.5)
    assert _decides(PredictConfig(), req(10_000), s) == "local"  # 2 s against 3.1 s
    assert _decides(PredictConfig(busy_weight=1.0), req(10_000), s) == "prfaas"  # 4 vs 3.6


def test_min_bandwidth_share_is_the_floor_under_the_estimate() -> None:
    hole = LinkView(0.0, 0.0, 0.0, 0.0, True)
    for share, expect in ((0.0, "local"), (0.05, "prfaas")):
        policy = PrfaasPredict(PredictConfig(min_bandwidth_share=share, ttft_target=None))
        policy.decide(req(1_000), snap())  # the nominal 100 Gbps seen once
        assert (
            policy.decide(req(60_000), snap(link=hole, local_wait=20.0)).prefill_cluster == expect
        )


def test_pull_prefixes_off_never_pulls() -> None:
    s = snap(prfaas_wait=8.0)
    on = PrfaasPredict().decide(req(50_000, prfaas=45_000), s)
    off = PrfaasPredict(PredictConfig(pull_prefixes=False)).decide(req(50_000, prfaas=45_000), s)
    assert on.pull_prefix_tokens == 45_000 and off.pull_prefix_tokens == 0


def test_triage_slack_bounds_how_much_later_the_lighter_option_may_be() -> None:
    s = snap(local_wait=20.0, prfaas_wait=45.0)  # 28 s local, 47 s PrfaaS: 1.68x
    assert _decides(PredictConfig(), req(40_000), s) == "prfaas"  # late anyway: the lighter
    assert _decides(PredictConfig(triage_slack=1.5), req(40_000), s) == "local"
    assert _decides(PredictConfig(triage_slack=2.0), req(40_000), s) == "prfaas"
    assert _decides(PredictConfig(ttft_target=60.0), req(40_000), s) == "local"


def test_triage_weight_dials_between_the_first_token_and_the_share() -> None:
    # late on both: 28 s on PD-P (busy 8 s), 47 s on PrfaaS (busy 2 s)
    s = snap(local_wait=20.0, prfaas_wait=45.0)
    assert _decides(PredictConfig(), req(40_000), s) == "prfaas"  # the smaller share outright
    assert _decides(PredictConfig(triage_weight=1.0), req(40_000), s) == "local"  # 36 vs 49
    assert _decides(PredictConfig(triage_weight=5.0), req(40_000), s) == "prfaas"  # 68 vs 57
    # nor on a link narrowed below half its nominal rate: its backlog clears when it heals
    policy = PrfaasPredict(PredictConfig(triage_weight=1.0))
    policy.decide(req(1_000), snap())  # the nominal 100 Gbps seen once
    narrowed = LinkView(20 * GBPS, 0.0, None, 0.02, True)
    s20 = snap(local_wait=20.0, prfaas_wait=45.0, link=narrowed)
    assert policy.decide(req(40_000), s20).prefill_cluster == "prfaas"
    # on time somewhere, the dial is not consulted: 10K, 2 s on PD-P against 3.1 s (with k = 5
    # PrfaaS would win, 5.6 against 12)
    assert _decides(PredictConfig(triage_weight=5.0), req(10_000), snap(prfaas_wait=2.5)) == "local"


def test_local_reserve_keeps_pd_p_for_short_prompts_while_prfaas_is_late() -> None:
    # t = 20K, reserve 0.9: past 18K uncached locally a request is long. PrfaaS 15 s behind
    # (late); 19K takes 3.8 s on PD-P, on time: the earliest, unless it is long
    late = snap(prfaas_wait=15.0)
    reserve = PredictConfig(local_reserve=0.9)
    assert _decides(PredictConfig(), req(19_000), late) == "local"
    assert _decides(reserve, req(19_000), late) == "prfaas"
    assert _decides(reserve, req(17_000), late) == "local"  # short: PD-P's on-time slot
    # what PD-P's cache holds is not work: 19K with 2K cached locally is short
    assert _decides(reserve, req(19_000, local=2_000), late) == "local"
    # PrfaaS on time (5 s behind, 19K there in 5.95 s + transfer): the earliest decides
    assert _decides(reserve, req(19_000), snap(prfaas_wait=5.0)) == "local"
    # late on both (PD-P 12 s behind, PrfaaS 40 s): the dial (k = 1) sends both PD-P's way
    # (19K: 15.8 + 3.8 against 41 + 1); the reserve takes the long one off it
    both = snap(local_wait=12.0, prfaas_wait=40.0)
    assert _decides(PredictConfig(triage_weight=1.0), req(19_000), both) == "local"
    dial = PredictConfig(local_reserve=0.9, triage_weight=1.0)
    assert _decides(dial, req(19_000), both) == "prfaas"
    assert _decides(dial, req(17_000), both) == "local"


def test_busy_rate_charges_the_kv_at_the_links_nominal_rate() -> None:
    # the link narrowed from 100 to 2 Gbps; a 40K prompt is late either way: 28 s on PD-P
    # (busy 8 s), 17.8 s on PrfaaS, whose 4 GB of KV hold the narrowed link 17.8 s but the
    # healed one 0.3 s (its compute share, 2 s, is the larger)
    narrow = LinkView(2 * GBPS, 0.0, None, 0.0, True)
    for rate, expect in (("nominal", "prfaas"), ("current", "local")):
        policy = PrfaasPredict(PredictConfig(busy_rate=rate, min_bandwidth_share=0.0))
        policy.decide(req(1_000), snap())  # the nominal 100 Gbps seen once
        p = policy.decide(req(40_000), snap(link=narrow, local_wait=20.0))
        assert p.prefill_cluster == expect
        assert policy.last is not None
        assert policy.last.prfaas_busy == pytest.approx(2.0 if rate == "nominal" else 17.78, 1e-3)
    # a policy that never saw the link wider takes the highest estimate it saw: 4 GB at 2 Gbps
    fresh = PrfaasPredict(PredictConfig(min_bandwidth_share=0.0))
    fresh.decide(req(40_000), snap(link=narrow, local_wait=20.0))
    assert fresh.last is not None and fresh.last.prfaas_busy == pytest.approx(16.0)


def test_count_queued_kv_and_recount_s_decide_what_counts_as_ahead() -> None:
    """The PrfaaS queues' KV is summed at most every recount_s: a sum taken while PrfaaS held
    60K tokens keeps a 40K prompt local on a narrow link, until the next sum sees them gone."""
    narrow = LinkView(5 * GBPS, 0.0, None, 0.0, True)
    loaded = snap(inst("prfaas-q", "prfaas", "prefill", 60_000, 3.0), link=narrow)
    policy = PrfaasPredict(PredictConfig(recount_s=5.0, ttft_target=None))
    assert policy.decide(req(40_000), loaded).prefill_cluster == "local"
    assert policy.decide(req(40_000), snap(link=narrow, now=4.0)).prefill_cluster == "local"
    assert policy.decide(req(40_000), snap(link=narrow, now=5.0)).prefill_cluster == "prfaas"
    blind = PrfaasPredict(PredictConfig(count_queued_kv=False, ttft_target=None))
    assert blind.decide(req(40_000), loaded).prefill_cluster == "prfaas"


# ---------------------------------------------------------------- the knobs reach router and sim


def test_the_router_makes_the_policy_with_the_scenarios_knobs() -> None:
    from testbed.services.router.dispatch import RouterState
    from testbed.services.spec import ServiceSpec
    from tests.services.test_router_spec_fields import INSTANCES

    config = PolicyConfig(name="prfaas-predict", predict=PredictConfig(link_headroom=0.5))
    state = RouterState(ServiceSpec(role="router", id="r", instances=INSTANCES,
                                    policy="prfaas-predict", policy_config=config))  # fmt: skip
    assert isinstance(state.policy, PrfaasPredict)
    assert state.policy.knobs.link_headroom == 0.5


def _drop_run(policy: str, **predict: Any) -> tuple[float, float, float, int]:
    """bandwidth-drop on the sim: P90 TTFT during the drop, PrfaaS share of the routes before
    and during it, failures."""
    import numpy as np

    from testbed.scenario.library import LIBRARY_DIR
    from testbed.scenario.schema import load_scenario
    from testbed.scenario.sweep import simulate_scenario

    base = load_scenario(LIBRARY_DIR / "bandwidth-drop.yaml")
    pol = base.policy.model_copy(
        update={"name": policy, "predict": base.policy.predict.model_copy(update=predict)}
    )
    _, summary, recs = simulate_scenario(base.model_copy(update={"policy": pol, "checkers": []}))

    def share(lo: float, hi: float) -> float:
        rs = [r for r in recs if lo <= r.arrival < hi]
        return sum(r.route == "prfaas" for r in rs) / len(rs)

    during = [r.ttft for r in recs if r.ttft is not None and 60 <= r.arrival < 120]
    return (float(np.percentile(during, 90)), share(0, 60), share(60, 120),
            summary["requests"]["failed"])  # fmt: skip


def test_on_the_sim_it_keeps_long_prompts_off_the_narrow_link_and_beats_static() -> None:
    p90, before, during, failed = _drop_run("prfaas-predict")
    static_p90, *_, static_failed = _drop_run("prfaas-static")
    assert failed == 0 and static_failed == 0
    assert during < before  # the drop moved routes off the link
    assert p90 < static_p90
    # the scenario's knobs reach the sim: a link believed at 1% of its estimate is never used
    *_, none_during, _ = _drop_run("prfaas-predict", link_headroom=0.01, ttft_target=None)
    assert none_during < during
