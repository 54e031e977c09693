"""`prfaas-predict` on hand-made snapshots: earliest predicted first token, the threshold as the
guard where predictions are stale, and a decision that does not scan the instances."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import pytest

from testbed.config.policy import PredictConfig
from testbed.policy import get_policy, make_policy
from testbed.policy.base import CostModel, InstanceLoad, LinkView, RequestView, Snapshot
from testbed.policy.predict import PrfaasPredict, predict

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
    p = predict(req(50_000), snap().least_loaded("local", "prefill"),
                snap().least_loaded("prfaas", "prefill"), COSTS, narrow, PredictConfig())  # fmt: skip
    assert p.local == pytest.approx(10.0)
    assert p.prfaas == pytest.approx(2 * 5e9 / (0.9 * 5 * GBPS) + 0.02)


def test_kv_the_prfaas_queues_will_emit_counts_as_ahead_on_the_link() -> None:
    narrow = LinkView(5 * GBPS, 0.0, None, 0.0, True)
    busy = inst("prfaas-p", "prfaas", "prefill", 20_000, 1.0)
    local = inst("local-p", "local", "prefill")
    counted = predict(req(30_000), local, busy, COSTS, narrow, PredictConfig())
    ignored = predict(
        req(30_000), local, busy, COSTS, narrow, PredictConfig(count_queued_kv=False)
    )
    assert counted.prfaas - ignored.prfaas == pytest.approx(2e9 / (0.9 * 5 * GBPS) - 2.5)  # 1 s queue + 1.5 s prefill


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

    def least(
        self, cluster: str | None, role: str, exclude: frozenset[str]
    ) -> InstanceLoad | None:
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
