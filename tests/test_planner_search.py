"""The planner's vectorised search finds the exhaustive search's plan, field for field.

The fast search computes Lambda_max of every (threshold, PD split) pair with numpy and runs the
scalar code only on the pairs that can hold the best key; these tests run both on the paper's
deployments, a scarce link, a pinned split, a fixed threshold and deployments 10x and 25x the
paper's (where the grid is large enough for the fast path to matter), and check the plans are
identical (the Table 6 figures themselves are tests/test_planner.py's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.config import DeploymentConfig
from testbed.planner import PlanInputs, plan_deployment, plan_inputs
from testbed.scenario.schema import load_scenario

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def paper() -> tuple[dict[str, DeploymentConfig], PlanInputs]:
    scenario = load_scenario(ROOT / "scenarios" / "paper.yaml")
    return dict(scenario.deployments), plan_inputs(scenario)


def _scaled(dep: DeploymentConfig, factor: int, gbps: float | None = None) -> DeploymentConfig:
    assert dep.prfaas is not None
    return dep.model_copy(
        update={
            "prfaas": dep.prfaas.model_copy(update={"instances": dep.prfaas.instances * factor}),
            "local": dep.local.model_copy(update={"instances": dep.local.instances * factor}),
            "link": dep.link.model_copy(update={"bandwidth": (gbps or 100.0 * factor) * 1e9 / 8}),
        }
    )


def _both(dep: DeploymentConfig, inputs: PlanInputs, **kw: object) -> None:
    fast = plan_deployment("d", dep, inputs, **kw)  # type: ignore[arg-type]
    ref = plan_deployment("d", dep, inputs, exhaustive=True, **kw)  # type: ignore[arg-type]
    assert fast == ref


@pytest.mark.parametrize("name", ["prfaas-pd", "homogeneous", "naive"])
def test_paper_deployments(paper, name: str) -> None:  # type: ignore[no-untyped-def]
    deps, inputs = paper
    _both(deps[name], inputs)


@pytest.mark.parametrize("kw", [{"link_bytes_per_s": 5e9 / 8}, {"n_prefill": 2},
                                {"threshold_tokens": 30_000.0}])  # fmt: skip
def test_paper_prfaas_pd_variants(paper, kw: dict[str, object]) -> None:  # type: ignore[no-untyped-def]
    deps, inputs = paper
    _both(deps["prfaas-pd"], inputs, **kw)


@pytest.mark.parametrize(("factor", "gbps"), [(10, None), (10, 100.0), (25, None), (25, 800.0)])
def test_scaled_deployments(paper, factor: int, gbps: float | None) -> None:  # type: ignore[no-untyped-def]
    """Large grids (up to 1,280 thresholds x 199 splits): the vectorised path runs; a thin link
    makes the link the bottleneck and moves the threshold."""
    deps, inputs = paper
    _both(_scaled(deps["prfaas-pd"], factor, gbps), inputs)
