"""How long one planner search takes (the scheduler re-runs it at run time).

Prints the wall time of a full grid search (every threshold x every PD split) and of a search with
the PD split pinned, for the paper's deployment, plus the plan it finds.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from testbed.planner import plan_deployment, plan_inputs
from testbed.scenario.schema import load_scenario

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    scenario = load_scenario(ROOT / "scenarios" / "paper.yaml")
    dep = scenario.deployments["prfaas-pd"]
    inputs = plan_inputs(scenario)
    for label, kwargs in (("full search", {}), ("split pinned (N_p=3)", {"n_prefill": 3})):
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            plan = plan_deployment("prfaas-pd", dep, inputs, **kwargs)  # type: ignore[arg-type]
            times.append(time.perf_counter() - t0)
        print(
            f"{label:22s} median {statistics.median(times) * 1e3:7.1f} ms  "
            f"-> t={plan.threshold_tokens:.0f} N_p/N_d={plan.n_prefill}/{plan.n_decode} "
            f"lambda_max={plan.lambda_max_rps:.2f} req/s"
        )


if __name__ == "__main__":
    main()
