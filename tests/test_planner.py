"""The planner must reproduce the paper's Table 6 from its Table 5 profile."""

from pathlib import Path

import pytest

from testbed.cli.plan import plan_scenario
from testbed.planner import plan_deployment, plan_inputs
from testbed.scenario.schema import load_scenario

PAPER = Path(__file__).resolve().parents[1] / "scenarios" / "paper.yaml"


@pytest.fixture(scope="module")
def plans():  # type: ignore[no-untyped-def]
    return plan_scenario(load_scenario(PAPER))


def test_prfaas_pd_matches_table6(plans) -> None:  # type: ignore[no-untyped-def]
    p = plans["prfaas-pd"]
    assert p.lambda_max_rps == pytest.approx(3.24, rel=0.03)
    assert p.threshold_tokens == pytest.approx(19_400, rel=0.05)
    assert p.offload_fraction == pytest.approx(0.496, abs=0.02)
    assert (p.n_prfaas, p.n_prefill, p.n_decode) == (4, 3, 5)
    assert p.egress_gbps == pytest.approx(13, rel=0.15)
    assert p.theta_prfaas_rps == pytest.approx(1.61, rel=0.03)
    assert p.theta_pdp_rps == pytest.approx(1.64, rel=0.03)
    assert p.theta_pdd_rps == pytest.approx(3.91, rel=0.01)


def test_homogeneous_matches_table6(plans) -> None:  # type: ignore[no-untyped-def]
    p = plans["homogeneous"]
    assert p.lambda_max_rps == pytest.approx(2.11, rel=0.03)
    assert (p.n_prefill, p.n_decode) == (9, 3)
    assert p.theta_pdd_rps == pytest.approx(2.35, rel=0.01)
    assert p.offload_fraction == 0 and p.egress_gbps == 0 and p.theta_prfaas_rps is None


def test_naive_matches_table6(plans) -> None:  # type: ignore[no-untyped-def]
    p = plans["naive"]
    assert p.lambda_max_rps == pytest.approx(2.45, rel=0.03)
    assert (p.n_prfaas, p.n_prefill, p.n_decode) == (4, 0, 8)
    assert p.theta_pdd_rps == pytest.approx(6.25, rel=0.01)
    assert p.offload_fraction == 1.0 and p.theta_pdp_rps is None


def test_headline_gains(plans) -> None:  # type: ignore[no-untyped-def]
    # The paper: PrfaaS-PD = 1.54x homogeneous and 1.32x naive heterogeneous.
    ratio_h = plans["prfaas-pd"].lambda_max_rps / plans["homogeneous"].lambda_max_rps
    ratio_n = plans["prfaas-pd"].lambda_max_rps / plans["naive"].lambda_max_rps
    assert ratio_h == pytest.approx(1.54, rel=0.03)
    assert ratio_n == pytest.approx(1.32, rel=0.05)


def test_scarce_bandwidth_raises_threshold_and_cuts_egress(plans) -> None:  # type: ignore[no-untyped-def]
    scenario = load_scenario(PAPER)
    dep = scenario.deployments["prfaas-pd"]
    scarce = plan_deployment("prfaas-pd", dep, plan_inputs(scenario), link_bytes_per_s=5e9 / 8)
    assert scarce.threshold_tokens is not None and plans["prfaas-pd"].threshold_tokens is not None
    assert scarce.threshold_tokens > plans["prfaas-pd"].threshold_tokens
    assert scarce.egress_gbps <= 5.0 + 1e-9
    assert scarce.lambda_max_rps < plans["prfaas-pd"].lambda_max_rps


def test_pinned_split_is_respected(plans) -> None:  # type: ignore[no-untyped-def]
    scenario = load_scenario(PAPER)
    dep = scenario.deployments["prfaas-pd"]
    pinned = plan_deployment("prfaas-pd", dep, plan_inputs(scenario), n_prefill=2)
    assert (pinned.n_prefill, pinned.n_decode) == (2, 6)
    assert pinned.lambda_max_rps < plans["prfaas-pd"].lambda_max_rps
