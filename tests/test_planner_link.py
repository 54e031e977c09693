"""#19: the planner makes the link visible: a `link` bottleneck when the cap binds, the link's
use at lambda_max, the highest rate it carries at a threshold, and planning at a fixed t.
Checked against figures computed by hand from the paper's Table 3."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.cli import main
from testbed.planner import plan_deployment, plan_inputs
from testbed.scenario.library import LIBRARY_DIR
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.schema import Scenario, load_scenario

GBPS = 1e9 / 8
T_32K = 1.84  # Table 5: prefill of 32K tokens on one 8xH200 instance, seconds


def fixed_32k(model: str) -> Scenario:
    return Scenario.model_validate(
        {
            "deployments": {
                "d": {
                    "kind": "prfaas-pd",
                    "model": model,
                    "prfaas": {"hardware": "h200x8", "instances": 4},
                    "local": {"hardware": "h20x8", "instances": 8},
                    "link": {"bandwidth": 100 * GBPS},
                }
            },
            "workload": {"lengths": {"kind": "fixed", "tokens": 32 * 1024}, "output_tokens": 1024},
        }
    )


def plan_at(model: str, t: float | None = 19_500):  # type: ignore[no-untyped-def]
    sc = fixed_32k(model)
    return plan_deployment("d", sc.deployments["d"], plan_inputs(sc), threshold_tokens=t)


def test_dense_kv_is_held_by_the_link_as_table3_says() -> None:
    # MiniMax-M2.5 emits 59.93 Gbps of KV per instance at 32K (Table 3): a request is
    # 59.93 Gbps x 1.84 s = 110.3 Gbit, so 100 Gbps carries 0.907 req/s; 4 instances could
    # prefill 4 / 1.84 = 2.17 req/s.
    by_hand = 100 / (59.93 * T_32K)
    p = plan_at("minimax-m2.5")
    assert p.offload_fraction == 1.0  # every 32K prompt is over t = 19.5K
    assert p.lambda_max_rps == pytest.approx(by_hand, rel=1e-3)
    assert p.bottleneck == "link"
    assert p.link_utilisation == pytest.approx(1.0, rel=1e-3)
    assert p.link_max_rps == pytest.approx(by_hand, rel=1e-3)


def test_hybrid_kv_leaves_the_link_mostly_idle() -> None:
    # Kimi Linear 48B: 3.87 Gbps per instance at 32K: compute binds at 4 / 1.84 req/s and the
    # link carries that at 4 x 3.87 = 15.5 Gbps.
    p = plan_at("kimi-linear-48b")
    assert p.lambda_max_rps == pytest.approx(4 / T_32K, rel=1e-3)
    assert p.bottleneck == "prfaas"
    assert p.link_utilisation == pytest.approx(4 * 3.87 / 100, rel=1e-3)
    assert p.link_max_rps == pytest.approx(100 / (3.87 * T_32K), rel=1e-3)


def test_the_link_label_also_when_the_search_ties_it_with_another_stage() -> None:
    """On the paper's workload the search raises t until the dense model's KV fits: pd-d is a
    hair below the link-held PrfaaS stage, and the link is what set the operating point."""
    sc = load_scenario(LIBRARY_DIR / "thesis.yaml")
    dep = sc.deployments["minimax-m2.5"]
    free = plan_deployment("m", dep, plan_inputs(sc))
    assert free.bottleneck == "link"
    assert free.link_utilisation > 0.98
    hybrid = plan_deployment("h", sc.deployments["internal-1t-hybrid"], plan_inputs(sc))
    assert hybrid.bottleneck == "prfaas" and hybrid.link_utilisation < 0.2


def test_a_fixed_threshold_is_planned_as_it_will_run() -> None:
    sc = load_scenario(LIBRARY_DIR / "thesis.yaml")
    dense = sc.model_copy(update={"deployment": "minimax-m2.5"})
    opts = RunOptions(out_dir=Path("unused"), progress=False)
    rp = prepare_run(dense, opts)
    assert rp.threshold_tokens == 19_500
    assert rp.plan.threshold_tokens == 19_500  # not the 39.7K the search would pick
    assert rp.plan.lambda_max_rps == pytest.approx(1.447, abs=0.005)
    auto = dense.model_copy(
        update={"policy": dense.policy.model_copy(update={"threshold": "auto"})}
    )
    searched = plan_deployment("m", dense.deployments["minimax-m2.5"], plan_inputs(dense))
    assert searched.threshold_tokens != 19_500
    assert prepare_run(auto, opts).plan.threshold_tokens == searched.threshold_tokens


def test_plan_threshold_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "thesis", "--json", "--threshold", "19.5K"]) == 0
    doc = json.loads(capsys.readouterr().out)["deployments"]
    assert {d["threshold_tokens"] for d in doc.values()} == {19_500}
    assert doc["minimax-m2.5"]["bottleneck"] == "link"
    assert doc["minimax-m2.5"]["link_max_rps"] == pytest.approx(1.447, abs=0.005)
    assert main(["plan", "thesis"]) == 0
    table = capsys.readouterr().out
    assert "link use at lambda_max" in table and "link carries up to" in table
    assert "30.1K" in table  # searched (the paper's split pinned: 3 PD-P)
