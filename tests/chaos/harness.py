"""Short versions of the scenario library for the chaos suite.

`chaos_variant` keeps a scenario's workload, policy, nemesis timeline and checkers (all in
real-world time) and swaps in a tiny deployment (2 PrfaaS + 1 PD-P + 3 PD-D instances, one
process each) at time_scale 20 / byte_scale 2000, so a 180 s scenario plays in about 9 s of
wall time (scenarios on the real tiny model, `engine: torch`, are small already and run as
they are). The tiny deployment keeps the scenario's model and hardware (a user profile's too).
Faults aimed at a group (`local-decode`) still resolve; the arrival rate follows the smaller
deployment (a `load` by itself, a fixed `rate` by the ratio of the two lambda_max), and so do
link bandwidth faults (scaled by the ratio of PrfaaS instances).
"""

from __future__ import annotations

from pathlib import Path

from testbed.config import DeploymentConfig, ScaleConfig
from testbed.planner import plan_deployment, plan_inputs
from testbed.scenario.plan import RunOptions, RunResult, prepare_run
from testbed.scenario.runner import run_scenario
from testbed.scenario.schema import Scenario, load_scenario

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"
LIBRARY = sorted(p.stem for p in SCENARIOS.glob("*.yaml"))
TORCH_SCENARIOS = frozenset(
    name
    for name in LIBRARY
    if any(
        d.engine == "torch" for d in load_scenario(SCENARIOS / f"{name}.yaml").deployments.values()
    )
)
"""Scenarios on the tiny real model: run as they are (they need torch: marker `model`)."""

TINY = DeploymentConfig.model_validate(
    {
        "kind": "prfaas-pd",
        "prfaas": {"hardware": "h200x8", "instances": 2},
        "local": {"hardware": "h20x8", "instances": 4, "prefill": 1, "decode": 3},
        "link": {"bandwidth": "100Gbps", "rtt": "20ms", "jitter": "2ms", "connections": 2},
    }
)


def chaos_variant(name: str, **updates: object) -> Scenario:
    """The short version of scenarios/NAME.yaml (see the module docstring)."""
    sc = load_scenario(SCENARIOS / f"{name}.yaml")
    if name in TORCH_SCENARIOS:  # already tiny; its real tensors need byte_scale 1
        # its time_scale is calibrated (auto, often below 1 on a shared CPU): 8 s of arrivals
        # (4 requests, both routes) keep the model tests short
        return sc.model_copy(update={"duration": 8.0, **updates})
    # A bandwidth fault keeps its bite: the tiny deployment's PrfaaS cluster offers the link
    # less KV, so the link is cut in the same proportion.
    full = sc.deployments[sc.deployment] if sc.deployment else next(iter(sc.deployments.values()))
    tiny = _tiny_like(full)
    assert TINY.prfaas is not None
    ratio = TINY.prfaas.instances / full.prfaas.instances if full.prfaas is not None else 1.0
    nemesis = [
        ev.model_copy(update={"bandwidth": ev.bandwidth * ratio})
        if ev.action == "bandwidth" and ev.bandwidth is not None
        else ev
        for ev in sc.nemesis
    ]
    workload = sc.workload
    rate = workload.arrivals.rate
    if rate is not None:  # a rate, unlike a load, does not follow the deployment: scale it
        inputs = plan_inputs(sc)
        t = sc.policy.threshold
        fixed = None if t == "auto" else float(t)  # as prepare_run plans a fixed threshold
        ratio_rps = (
            plan_deployment("tiny", tiny, inputs, threshold_tokens=fixed).lambda_max_rps
            / plan_deployment("full", full, inputs, threshold_tokens=fixed).lambda_max_rps
        )
        arrivals = workload.arrivals.model_copy(update={"rate": rate * ratio_rps})
        workload = workload.model_copy(update={"arrivals": arrivals})
    return sc.model_copy(
        update={
            "deployments": {"tiny": tiny},
            "deployment": "tiny",
            "scale": ScaleConfig(time_scale=20, byte_scale=2000),
            "nemesis": nemesis,
            "workload": workload,
            **updates,
        }
    )


def _tiny_like(full: DeploymentConfig) -> DeploymentConfig:
    """TINY with the scenario's own model and hardware (a user profile's included)."""
    assert TINY.prfaas is not None
    prfaas_hw = full.prfaas.hardware if full.prfaas is not None else TINY.prfaas.hardware
    return TINY.model_copy(
        update={
            "model": full.model,
            "prfaas": TINY.prfaas.model_copy(update={"hardware": prfaas_hw}),
            "local": TINY.local.model_copy(update={"hardware": full.local.hardware}),
        }
    )


async def run_variant(
    sc: Scenario, out: Path, *, policy: str | None = None, duration_s: float | None = None
) -> RunResult:
    opts = RunOptions(
        out_dir=out, progress=False, policy=policy, duration_s=duration_s, drain_timeout_s=60
    )
    return await run_scenario(prepare_run(sc, opts), opts)
