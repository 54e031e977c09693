"""The paper's what-if grid through `testbed sweep`, as a user runs it, its table kept as a report.

    python bench/sim_sweep.py --report bench/reports/sim.md

runs `testbed sweep paper --set deployments.prfaas-pd.link.bandwidth=10Gbps,25Gbps,50Gbps,100Gbps
--set deployments.prfaas-pd.prfaas.instances=2,4,6,8` (docs/sim.md's example: 16 cells, each
simulated as offered and again at 120% of the planner's lambda_max) in a child process, and
prints the wall time it took with the sweep.md it wrote: each cell's saturation next to the
planner's, the flagged cells and the Pareto front. `--set` replaces the grid (repeat it for more
axes); `--no-saturation` skips the saturation runs. Sim only: the same grid gives the same
table; the wall time is the machine's.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from provenance import (  # bench/: the script's directory is on sys.path
    TESTBED,
    reported,
    timed_child,
)

GRID = [
    "deployments.prfaas-pd.link.bandwidth=10Gbps,25Gbps,50Gbps,100Gbps",
    "deployments.prfaas-pd.prfaas.instances=2,4,6,8",
]
"""docs/sim.md's example grid: the paper's link bandwidth by PrfaaS instances."""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--set", action="append", metavar="PATH=V1,V2", help="an axis (default: GRID)")
    ap.add_argument("--no-saturation", action="store_true", help="testbed sweep's --no-saturation")
    ap.add_argument("--report", type=Path, metavar="FILE", help="also write the output here")
    args = ap.parse_args()
    axes = args.set or GRID
    setup = f"sim; scenarios/paper.yaml, the scenario's seed; {os.cpu_count()} local processes"
    reported(args.report, "sim_sweep", "Sweeps", setup, lambda: measure(axes, args))
    return 0


def measure(axes: list[str], args: argparse.Namespace) -> None:
    """Run the sweep in a child; print its wall time and sweep.md. A failed sweep exits with
    its status and error, before anything is written to the report."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [*TESTBED, "sweep", "paper", "--out", tmp, "--quiet"]
        cmd += [a for axis in axes for a in ("--set", axis)]
        cmd += ["--no-saturation"] if args.no_saturation else []
        wall = timed_child(cmd)
        shown = " ".join(f"--set {axis}" for axis in axes)
        print(f"testbed sweep paper {shown}: {wall:.1f} s wall\n")
        print((Path(tmp) / "sweep.md").read_text().strip())


if __name__ == "__main__":
    raise SystemExit(main())
