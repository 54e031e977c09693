"""Saturation on the sim against live and the planner (issue #15, acceptance 2).

The method of bench/fidelity.py: each of the paper's three deployments offered 120% of the
planner's lambda_max (uniform arrivals, the paper's workload), the completion rate over the
steady window (the last five sixths) being the saturation throughput. Prints it for the sim next
to the planner's lambda_max and the live figures bench/fidelity.py measured (600 s runs).

Usage: python bench/sim_saturation.py [--duration 600]   (a few seconds)
"""

from __future__ import annotations

import argparse
import sys

from testbed.scenario.library import LIBRARY_DIR
from testbed.scenario.schema import load_scenario
from testbed.scenario.sweep import completion_rate, simulate_scenario
from testbed.units import parse_duration

CASES = (("prfaas-pd", "prfaas-static"), ("homogeneous", "homogeneous"), ("naive", "naive"))
LIVE = {"prfaas-pd": 3.11, "homogeneous": 2.00, "naive": 2.36}
"""req/s, bench/fidelity.py at 120% of lambda_max, 600 s real-world, this machine (README)."""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--duration", type=parse_duration, default=600.0)
    args = ap.parse_args()
    base = load_scenario(LIBRARY_DIR / "paper.yaml")
    print(f"saturation at 120% of lambda_max, {args.duration:.0f}s real-world, sim vs live")
    print("| deployment | planner | sim | sim vs planner | live | sim vs live |")
    print("|---|---|---|---|---|---|")
    for dep, policy in CASES:
        wl = base.workload
        sc = base.model_copy(
            update={
                "deployment": dep,
                "duration": args.duration,
                "checkers": [],
                "policy": base.policy.model_copy(update={"name": policy}),
                "workload": wl.model_copy(
                    update={"arrivals": wl.arrivals.model_copy(update={"load": 1.2})}
                ),
            }
        )
        rp, _, records = simulate_scenario(sc)
        rate = completion_rate(records, args.duration / 6, args.duration)
        planned = rp.plan.lambda_max_rps
        print(
            f"| {dep} | {planned:.2f} | {rate:.2f} | {rate / planned - 1:+.1%} | {LIVE[dep]:.2f} | "
            f"{rate / LIVE[dep] - 1:+.1%} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
