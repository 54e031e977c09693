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

from testbed.scenario.plan import RunOptions, RunResult, prepare_run
from testbed.scenario.runner import run_scenario
from testbed.scenario.schema import Scenario, load_scenario
from testbed.scenario.short import SHORT_DEPLOYMENT, short_variant
from testbed.scenario.sim_run import run_sim

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

TINY = SHORT_DEPLOYMENT


def chaos_variant(name: str, **updates: object) -> Scenario:
    """The short version of scenarios/NAME.yaml (testbed.scenario.short.short_variant, which
    `testbed scorecard --substrate local` runs too)."""
    return short_variant(load_scenario(SCENARIOS / f"{name}.yaml"), **updates)


async def run_variant(
    sc: Scenario, out: Path, *, policy: str | None = None, duration_s: float | None = None
) -> RunResult:
    """A live run of `sc` on the local substrate (timeline.png not drawn: about 1 s a run, and
    tests/metrics draws it)."""
    opts = RunOptions(out_dir=out, progress=False, policy=policy, duration_s=duration_s,
                      drain_timeout_s=60, timeline=False)  # fmt: skip
    return await run_scenario(prepare_run(sc, opts), opts)


def run_sim_variant(sc: Scenario, out: Path, *, policy: str | None = None) -> RunResult:
    """The same on the sim substrate: the chaos suite's sim leg."""
    opts = RunOptions(substrate="sim", out_dir=out, progress=False, policy=policy,
                      drain_timeout_s=30, timeline=False)  # fmt: skip
    return run_sim(prepare_run(sc, opts), opts)
