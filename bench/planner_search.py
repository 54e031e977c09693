"""How long one planner search takes (the scheduler re-runs it at run time), at the paper's size
and at 10K-GPU scale.

For the paper's prfaas-pd deployment (4 + 8 instances) and the same scaled 100x (400 + 800, the
issue's 11.7 s figure) and 104x (416 + 832 instances, 9,984 GPUs: bench/sim_scale.py's), prints
the median wall time of the full search (every threshold x every PD split: what `testbed plan`
and a long-term re-plan run) and of a search with the PD split pinned (what the short-term loop
runs), for the vectorised search and the exhaustive scalar one, and whether both found the same
plan.

Usage: python bench/planner_search.py [--repeat 5] [--no-exhaustive] [--report FILE]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from provenance import reported  # bench/ is on sys.path

from testbed.config import DeploymentConfig
from testbed.experiment import Grid
from testbed.planner import StagePlan, plan_deployment, plan_inputs
from testbed.scenario.schema import load_scenario

ROOT = Path(__file__).resolve().parents[1]


def scaled(dep: DeploymentConfig, factor: int) -> DeploymentConfig:
    """paper.yaml's prfaas-pd with `factor` times the instances of each cluster and the link's
    bandwidth, written as `--set` settings and validated as the file is."""
    assert dep.prfaas is not None
    at = "deployments.prfaas-pd"
    scenario = Grid.of(
        "paper",
        fixed={
            f"{at}.prfaas.instances": dep.prfaas.instances * factor,
            f"{at}.local.instances": dep.local.instances * factor,
            f"{at}.link.bandwidth": f"{dep.link.bandwidth * 8 * factor / 1e9:g}Gbps",
        },
    ).scenario_of()
    return scenario.deployments["prfaas-pd"]


def timed(repeat: int, fn: Any) -> tuple[float, StagePlan]:
    times, plan = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        plan = fn()
        times.append(time.perf_counter() - t0)
    assert plan is not None
    return statistics.median(times), plan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-exhaustive", action="store_true", help="skip the scalar reference")
    ap.add_argument("--report", type=Path, metavar="FILE", help="also write the table here")
    args = ap.parse_args()
    setup = (
        f"the planner alone; scenarios/paper.yaml's prfaas-pd x1, x100 and x104, medians of "
        f"{args.repeat}"
    )
    reported(args.report, "planner_search", "The planner's search", setup, lambda: measure(args))
    return 0


def measure(args: argparse.Namespace) -> None:
    """Print a row per deployment size and search: its median wall time and the plan."""
    scenario = load_scenario(ROOT / "scenarios" / "paper.yaml")
    base = scenario.deployments["prfaas-pd"]
    inputs = plan_inputs(scenario)
    print(f"{'deployment':24s} {'search':14s} {'fast ms':>9s} {'exhaustive ms':>14s}  plan")
    for factor in (1, 100, 104):
        dep = scaled(base, factor)
        assert dep.prfaas is not None
        label = f"{dep.prfaas.instances} + {dep.local.instances} (x{factor})"
        pin = max(1, round(dep.local.instances * 3 / 8))
        for search, kw in (("full", {}), (f"N_p={pin} pinned", {"n_prefill": pin})):
            fast_s, plan = timed(
                args.repeat, lambda kw=kw, dep=dep: plan_deployment("p", dep, inputs, **kw)
            )
            ref = "-"
            if not args.no_exhaustive:
                reps = args.repeat if factor == 1 or kw else 1
                ref_s, ref_plan = timed(
                    reps,
                    lambda kw=kw, dep=dep: plan_deployment("p", dep, inputs, exhaustive=True, **kw),
                )
                same = "same plan" if ref_plan == plan else "PLANS DIFFER"
                ref = f"{ref_s * 1e3:14.1f}"
            else:
                same = ""
            print(
                f"{label:24s} {search:14s} {fast_s * 1e3:9.1f} {ref:>14s}  "
                f"t={plan.threshold_tokens:.0f} N_p/N_d={plan.n_prefill}/{plan.n_decode} "
                f"lambda_max={plan.lambda_max_rps:.2f} req/s {same}"
            )


if __name__ == "__main__":
    raise SystemExit(main())
