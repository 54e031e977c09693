"""Short versions of the scenario library for the chaos suite.

`chaos_variant` keeps a scenario's workload, policy, nemesis timeline and checkers (all in
real-world time) and swaps in a tiny deployment (2 PrfaaS + 1 PD-P + 3 PD-D instances, one
process each) at time_scale 20 / byte_scale 2000, so a 180 s scenario plays in about 9 s of
wall time (scenarios on the real tiny model, `engine: torch`, are small already and run as
they are). Faults aimed at a group (`local-decode`) still resolve; the arrival rate, given as a
fraction of lambda_max, follows the smaller deployment, and so do link bandwidth faults (scaled by
the ratio of PrfaaS instances).
"""

from __future__ import annotations

from pathlib import Path

from testbed.config import DeploymentConfig, ScaleConfig
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
    full = next(iter(sc.deployments.values()))
    assert TINY.prfaas is not None
    ratio = TINY.prfaas.instances / full.prfaas.instances if full.prfaas is not None else 1.0
    nemesis = [
        ev.model_copy(update={"bandwidth": ev.bandwidth * ratio})
        if ev.action == "bandwidth" and ev.bandwidth is not None
        else ev
        for ev in sc.nemesis
    ]
    return sc.model_copy(
        update={
            "deployments": {"tiny": TINY},
            "deployment": "tiny",
            "scale": ScaleConfig(time_scale=20, byte_scale=2000),
            "nemesis": nemesis,
            **updates,
        }
    )


async def run_variant(
    sc: Scenario, out: Path, *, policy: str | None = None, duration_s: float | None = None
) -> RunResult:
    opts = RunOptions(
        out_dir=out, progress=False, policy=policy, duration_s=duration_s, drain_timeout_s=60
    )
    return await run_scenario(prepare_run(sc, opts), opts)
