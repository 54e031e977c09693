"""The short-term loop's pieces: link estimate from sender counters, threshold re-planning,
and the cache-aware PrfaaS policy."""

from pathlib import Path

import pytest

from testbed.planner import plan_deployment, plan_inputs
from testbed.policy import make_policy
from testbed.policy.base import InstanceLoad, RequestView, Snapshot
from testbed.scenario.schema import load_scenario
from testbed.scheduler.bandwidth import LinkEstimator, LinkSample
from testbed.scheduler.shortterm import ThresholdController

GBPS = 1e9 / 8
PAPER = Path(__file__).resolve().parents[2] / "scenarios" / "paper.yaml"


def feed(est: LinkEstimator, t0: float, rate: float, inflight: float, n: int, dt: float = 1.0):  # type: ignore[no-untyped-def]
    acked = est._last.bytes_acked if est._last else 0.0
    out = []
    for i in range(1, n + 1):
        acked += rate * dt
        out.append(est.update(LinkSample(t0 + i * dt, acked, inflight)))
    return out


def test_estimate_follows_a_saturated_link_down_and_recovers() -> None:
    est = LinkEstimator(100 * GBPS)
    feed(est, 0, 12 * GBPS, 1 * GBPS, 5)  # light load, no standing queue: stays nominal
    assert est.estimate == pytest.approx(100 * GBPS)
    # 5 Gbps delivered while 20 Gbit sit in flight: a 4 s standing queue
    down = feed(est, 5, 5 * GBPS, 20 * GBPS, 3)
    assert est.bottleneck
    assert down[-1] < 10 * GBPS  # within 3 samples (3 s real)
    up = feed(est, 8, 3 * GBPS, 0.0, 50)  # nothing queued: the link may have recovered
    # a few quiet seconds in a long drop do not undo the estimate (no flapping)...
    assert up[4] < 40 * GBPS
    # ...but a link that stays quiet is believed again within a minute
    assert up[-1] > 90 * GBPS and not est.bottleneck
    # and a link that delivers more than the estimate is believed at once
    feed(est, 58, 5 * GBPS, 20 * GBPS, 3)
    jump = feed(est, 61, 60 * GBPS, 1 * GBPS, 1)
    assert jump[-1] >= 60 * GBPS


def test_partition_drives_the_estimate_towards_zero() -> None:
    est = LinkEstimator(100 * GBPS)
    feed(est, 0, 10 * GBPS, 1 * GBPS, 2)
    cut = feed(est, 2, 0.0, 5 * GBPS, 3)  # nothing acknowledged, bytes stuck in flight
    assert cut[-1] < 1 * GBPS


@pytest.fixture(scope="module")
def controller_parts():  # type: ignore[no-untyped-def]
    sc = load_scenario(PAPER)
    dep, inputs = sc.deployments["prfaas-pd"], plan_inputs(sc)

    def plan(bw: float):  # type: ignore[no-untyped-def]
        return plan_deployment("prfaas-pd", dep, inputs, link_bytes_per_s=bw, n_prefill=3)

    return plan


def test_threshold_rises_when_bandwidth_drops_and_falls_back(controller_parts) -> None:  # type: ignore[no-untyped-def]
    ctl = ThresholdController(controller_parts, 100 * GBPS, cooldown_s=2.0)
    t0 = ctl.threshold
    assert t0 == pytest.approx(19_500, rel=0.05) and not ctl.scarce
    small = ctl.update(1.0, 95 * GBPS)  # within the hysteresis band: no re-plan
    assert not small.changed and small.threshold_tokens == t0
    drop = ctl.update(2.0, 5 * GBPS)
    assert drop.changed and drop.threshold_tokens > t0 and drop.scarce
    assert ctl.update(2.5, 100 * GBPS).threshold_tokens == drop.threshold_tokens  # cooldown
    back = ctl.update(5.0, 100 * GBPS)
    assert back.changed and back.threshold_tokens == pytest.approx(t0)


def test_an_unchanged_decision_is_kept_until_the_next_plan(controller_parts) -> None:  # type: ignore[no-untyped-def]
    ctl = ThresholdController(controller_parts, 100 * GBPS, cooldown_s=2.0)
    first = ctl.update(1.0, 95 * GBPS)  # within the band: nothing planned
    assert ctl.update(1.5, 96 * GBPS) is first and ctl.kept() is first
    assert first.bandwidth == 100 * GBPS and not first.changed
    # a re-plan that leaves t where it was still records the bandwidth it planned with
    again = ctl.replan(3.0, 97 * GBPS)
    assert not again.changed and again.threshold_tokens == first.threshold_tokens
    assert ctl.kept() is again and again.bandwidth == 97 * GBPS


def _snap(scarce: bool) -> Snapshot:
    return Snapshot(
        0.0,
        (
            InstanceLoad("pf", "prfaas", "prefill", 0, 0),
            InstanceLoad("pdp", "local", "prefill", 0, 0),
            InstanceLoad("pdd", "local", "decode", 0, 0),
        ),
        threshold_tokens=10_000,
        bandwidth_scarce=scarce,
    )


def test_cache_aware_rule_scarce_vs_abundant() -> None:
    policy = make_policy("prfaas")
    # 30K prompt, 25K cached in PrfaaS only.
    req = RequestView("a", 30_000, 10, cached_local=0, cached_prfaas=25_000)
    scarce = policy.decide(req, _snap(True))
    assert scarce.prefill_cluster == "prfaas" and scarce.uncached_tokens == 5_000
    abundant = policy.decide(req, _snap(False))
    # best prefix anywhere leaves 5K <= t: prefill locally, pulling the prefix across
    assert abundant.prefill_cluster == "local" and abundant.uncached_tokens == 5_000
    assert abundant.pull_prefix_tokens == 25_000
    blind = make_policy("prfaas-nocache").decide(req, _snap(False))
    assert blind.prefill_cluster == "prfaas" and blind.uncached_tokens == 30_000
