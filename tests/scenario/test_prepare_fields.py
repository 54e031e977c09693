"""Scenario fields that decide a run before anything starts: each one, moved alone, changes
what `prepare_run` plans (the policy, the deployment, the threshold, the PD split, the rate,
the requests, the faults), in process, with no service started. The entries of
tests/test_no_silent_fields.py for the scenario and deployment models point here."""

from __future__ import annotations

from typing import Any

import pytest

from testbed.errors import UserError
from testbed.scenario.plan import RunOptions, RunPlan, prepare_run
from testbed.scenario.schema import Scenario

BASE: dict[str, Any] = {
    "name": "fields",
    "seed": 1,
    "duration": "60s",
    "deployments": {
        "pd": {
            "kind": "prfaas-pd",
            "prfaas": {"hardware": "h200x8", "instances": 2},
            "local": {"hardware": "h20x8", "instances": 4},
            "link": {"bandwidth": "100Gbps"},
        }
    },
    "workload": {
        "lengths": {"kind": "lognormal", "mu": 9.9, "sigma": 1.0, "min": 128, "max": "128K"},
        "output_tokens": 512,
        "arrivals": {"process": "poisson", "rate": 2.0},
    },
    "planner": {"threshold_step": 1000},
}


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over` merged in; a `lengths` union member is replaced whole."""
    out = dict(base)
    for k, v in over.items():
        nested = isinstance(v, dict) and isinstance(out.get(k), dict) and k != "lengths"
        out[k] = _merge(out[k], v) if nested else v
    return out


def scenario(**over: Any) -> Scenario:
    return Scenario.model_validate(_merge(BASE, over))


def plan(sc: Scenario, **opts: Any) -> RunPlan:
    return prepare_run(sc, RunOptions(**opts))


def dep(**over: Any) -> dict[str, Any]:
    """An override of the one deployment `pd`."""
    return {"deployments": {"pd": _merge(BASE["deployments"]["pd"], over)}}


@pytest.fixture(scope="module")
def base() -> RunPlan:
    return plan(scenario())


def test_seed_draws_other_requests(base: RunPlan) -> None:
    other = plan(scenario(seed=2))
    assert [r.arrival for r in other.requests] != [r.arrival for r in base.requests]


def test_duration_bounds_the_arrivals(base: RunPlan) -> None:
    short = plan(scenario(duration="20s"))
    assert short.duration_s == 20.0 and base.duration_s == 60.0
    assert max(r.arrival for r in short.requests) < 20.0 < max(r.arrival for r in base.requests)


def test_deployment_picks_which_deployment_runs() -> None:
    homo = {"kind": "homogeneous", "local": {"hardware": "h20x8", "instances": 4}}
    two = {"deployments": {**BASE["deployments"], "homo": homo}}
    sc = Scenario.model_validate({**BASE, **two, "deployment": "homo"})
    assert plan(sc, policy="homogeneous").deployment_name == "homo"
    # the scenario's prfaas-static on a homogeneous deployment would fail every request
    with pytest.raises(UserError, match="runs on a prfaas-pd deployment; deployment 'homo' is"):
        plan(sc)
    sc = Scenario.model_validate({**BASE, **two, "deployment": "pd"})
    assert plan(sc).deployment_name == "pd"
    with pytest.raises(UserError, match="set 'deployment'"):
        plan(Scenario.model_validate({**BASE, **two}), policy="naive")


def test_policy_name_and_threshold(base: RunPlan) -> None:
    assert base.policy == "prfaas-static" and base.threshold_tokens == base.plan.threshold_tokens
    fixed = plan(scenario(policy={"threshold": "7K"}))
    assert fixed.threshold_tokens == 7000.0
    assert plan(scenario(policy={"name": "prfaas"})).policy == "prfaas"


def test_threshold_step_is_the_planners_grid(base: RunPlan) -> None:
    coarse = plan(scenario(planner={"threshold_step": "10K"}))
    assert coarse.threshold_tokens is not None and coarse.threshold_tokens % 10_000 == 0
    assert base.threshold_tokens is not None and base.threshold_tokens % 10_000 != 0


def test_decode_speed_slo_sets_the_decode_batch(base: RunPlan) -> None:
    slow = plan(scenario(slo={"decode_tokens_per_s": 10}))
    assert slow.plan.bs_max > base.plan.bs_max  # a looser TPOT fits a bigger batch


def test_output_tokens_shape_requests_and_plan(base: RunPlan) -> None:
    more = plan(scenario(workload={"output_tokens": 2048}))
    assert {r.output_tokens for r in more.requests} == {2048}
    assert {r.output_tokens for r in base.requests} == {512}
    assert more.plan.theta_pdd_rps < base.plan.theta_pdd_rps


def test_lengths_of_the_workload_are_the_prompts(base: RunPlan) -> None:
    fixed = plan(scenario(workload={"lengths": {"kind": "fixed", "tokens": 3000}}))
    assert {r.input_tokens for r in fixed.requests} == {3000}
    assert len({r.input_tokens for r in base.requests}) > 10


def test_arrival_rate_or_load(base: RunPlan) -> None:
    assert base.rate_rps == 2.0
    loaded = plan(
        scenario(workload={"arrivals": {"process": "poisson", "rate": None, "load": 0.5}})
    )
    assert loaded.rate_rps == pytest.approx(0.5 * loaded.plan.lambda_max_rps)
    half = plan(scenario(workload={"arrivals": {"rate": 1.0}}))
    assert len(half.requests) < 0.75 * len(base.requests)


def test_max_requests_caps_the_run() -> None:
    assert len(plan(scenario(workload={"max_requests": 5})).requests) == 5


def test_shift_at_lengths_rate_and_load() -> None:
    shift = {"at": "30s", "lengths": {"kind": "fixed", "tokens": 50_000}, "rate": 4.0}
    rp = plan(scenario(workload={"shift": shift}))
    assert rp.shift_rate_rps == 4.0 and rp.shift_plan is not None
    after = [r for r in rp.requests if r.arrival >= 30.0]
    assert {r.input_tokens for r in after} == {50_000}
    assert all(r.input_tokens != 50_000 for r in rp.requests if r.arrival < 30.0)
    later = plan(scenario(workload={"shift": {**shift, "at": "45s"}}))
    assert min(r.arrival for r in later.requests if r.input_tokens == 50_000) >= 45.0
    loaded = plan(scenario(workload={"shift": {**shift, "rate": None, "load": 0.5}}))
    assert loaded.shift_plan is not None
    assert loaded.shift_rate_rps == pytest.approx(0.5 * loaded.shift_plan.lambda_max_rps)
    other = plan(
        scenario(workload={"shift": {**shift, "lengths": {"kind": "fixed", "tokens": 500}}})
    )
    assert other.shift_plan is not None
    assert other.shift_plan.lambda_max_rps != rp.shift_plan.lambda_max_rps


def test_pinned_local_split(base: RunPlan) -> None:
    assert (base.n_prefill, base.n_decode) == (base.plan.n_prefill, base.plan.n_decode)
    for local, split in (
        ({"prefill": 3}, (3, 1)),
        ({"decode": 3}, (1, 3)),
        ({"prefill": 2, "decode": 2}, (2, 2)),
    ):
        rp = plan(scenario(**dep(local={"hardware": "h20x8", "instances": 4, **local})))
        assert (rp.n_prefill, rp.n_decode) == split
        # the planner's optimum (and so `load:` rates and the throughput checker) is the one of
        # the split that runs, not of the split it would have picked
        assert (rp.plan.n_prefill, rp.plan.n_decode) == split


def test_instances_and_hardware_change_the_plan(base: RunPlan) -> None:
    bigger = plan(scenario(**dep(prfaas={"hardware": "h200x8", "instances": 4})))
    assert bigger.plan.lambda_max_rps > base.plan.lambda_max_rps
    more_local = plan(scenario(**dep(local={"hardware": "h20x8", "instances": 8})))
    assert more_local.n_prefill + more_local.n_decode == 8
    h20 = plan(scenario(**dep(prfaas={"hardware": "h20x8", "instances": 2})))
    assert h20.plan.theta_prfaas_rps is not None and base.plan.theta_prfaas_rps is not None
    assert h20.plan.theta_prfaas_rps < base.plan.theta_prfaas_rps


def test_kind_and_model_change_the_plan(base: RunPlan) -> None:
    naive = plan(scenario(**dep(kind="naive")), policy="naive")
    assert naive.threshold_tokens is None or naive.plan.offload_fraction == 1.0
    assert naive.plan.offload_fraction == 1.0 and base.plan.offload_fraction < 1.0
    other = plan(scenario(**dep(model="kimi-linear-48b")))
    assert other.plan.egress_gbps != base.plan.egress_gbps  # another KV size per token


def test_link_bandwidth_feeds_the_planner(base: RunPlan) -> None:
    narrow = plan(scenario(**dep(link={"bandwidth": "5Gbps"})))
    assert narrow.threshold_tokens is not None and base.threshold_tokens is not None
    assert narrow.threshold_tokens > base.threshold_tokens  # less to PrfaaS over a thin link


def test_nemesis_entries_are_planned(base: RunPlan) -> None:
    assert base.faults == []
    rp = plan(scenario(nemesis=[{"action": "kill", "at": "10s", "target": "local-decode"}]))
    assert [(f.action, f.start) for f in rp.faults] == [("kill", 10.0)]


def test_checkers_are_refused_before_the_run_when_they_cannot_be_judged() -> None:
    bad = [{"check": "throughput", "after": "10s", "until": "90s", "min_fraction": 0.5}]
    with pytest.raises(UserError, match=r"checkers\.0 \(throughput\)"):
        plan(scenario(checkers=bad))


def test_torch_engine_is_checked_before_the_run() -> None:
    sc = scenario(
        scale={"byte_scale": 1},
        workload={"lengths": {"kind": "fixed", "tokens": 100}, "output_tokens": 8},
        **dep(engine="torch"),
    )
    with pytest.raises(UserError, match="local substrate only"):
        plan(sc, substrate="compose")


@pytest.mark.parametrize(
    ("over", "needle"),
    [
        ({"prfaas": {"hardware": "h200x8", "instances": 2, "decode": 1}}, "prfaas.decode"),
        ({"prfaas": {"hardware": "h200x8", "instances": 2, "prefill": 2}}, "prfaas.prefill"),
        (
            {"kind": "naive", "local": {"hardware": "h20x8", "instances": 4, "prefill": 1}},
            "local.prefill: naive decodes on all of it",
        ),
    ],
)
def test_a_split_nothing_would_read_is_refused(over: dict[str, Any], needle: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=needle):
        scenario(**dep(**over))


def test_a_link_or_tiny_model_nothing_would_read_is_refused() -> None:
    from pydantic import ValidationError

    def homogeneous(**over: Any) -> Scenario:
        homo = {"kind": "homogeneous", "local": {"hardware": "h20x8", "instances": 4}, **over}
        return Scenario.model_validate({**BASE, "deployments": {"pd": homo}})

    homogeneous()
    with pytest.raises(ValidationError, match="link: a homogeneous deployment has no link"):
        homogeneous(link={"bandwidth": "10Gbps"})
    with pytest.raises(ValidationError, match="tiny_model: applies to engine: torch only"):
        scenario(**dep(tiny_model={"seed": 3}))
