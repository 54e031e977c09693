"""Short versions of the scenario library for the chaos suite.

`chaos_variant` keeps a scenario's workload, policy, nemesis timeline and checkers (all in
real-world time) and swaps in a tiny deployment (2 PrfaaS + 1 PD-P + 3 PD-D instances, one
process each) at time_scale 20 / byte_scale 2000, so a 180 s scenario plays in about 9 s of
wall time. Faults aimed at a group (`local-decode`) still resolve; the arrival rate, given as a
fraction of lambda_max, follows the smaller deployment.
"""

from __future__ import annotations

from pathlib import Path

from testbed.config import DeploymentConfig, ScaleConfig, Scenario, load_scenario
from testbed.scenario.runner import RunOptions, RunResult, prepare_run, run_scenario

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"
LIBRARY = sorted(p.stem for p in SCENARIOS.glob("*.yaml"))

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
    return sc.model_copy(
        update={
            "deployments": {"tiny": TINY},
            "deployment": "tiny",
            "scale": ScaleConfig(time_scale=20, byte_scale=2000),
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
