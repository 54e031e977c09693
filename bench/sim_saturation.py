"""Saturation on the sim against live and the planner (issue #15, acceptance 2).

The method of bench/fidelity.py: each of the paper's three deployments offered 120% of the
planner's lambda_max (uniform arrivals, the paper's workload), the completion rate over the
steady window (testbed.metrics.window) being the saturation throughput. Prints it for the sim
next to the planner's lambda_max and the live figures bench/fidelity.py measured (600 s runs),
read from its report (bench/reports/fidelity.md).

Then prfaas-pd alone at other run lengths (`--lengths`, default 120 s and 1,200 s): how long a
run the steady window needs before the ramp-up stops weighing on it.

Usage: python bench/sim_saturation.py [--duration 600s] [--lengths 120s,1200s] [--report FILE]
(a few seconds)
`--report` writes the table with its provenance (bench/reports/sim_saturation.md); the table
is a function of the seeds and of fidelity.md (tests/bench/test_reports.py regenerates it).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from provenance import provenance  # bench/provenance.py: the script's directory is on sys.path

from testbed.experiment import Grid, Run, completion_rate, run_experiment, steady_window
from testbed.units import parse_duration

CASES = (
    {"deployment": "prfaas-pd", "policy.name": "prfaas-static"},
    {"deployment": "homogeneous", "policy.name": "homogeneous"},
    {"deployment": "naive", "policy.name": "naive"},
)
FIDELITY = Path(__file__).resolve().parent / "reports" / "fidelity.md"
"""Where the live figures come from: bench/fidelity.py's section, its planned-vs-measured table."""


def live_rates(report: Path = FIDELITY) -> dict[str, float]:
    """The live saturation throughput of each deployment (req/s at 120% of lambda_max, 600 s
    real-world), read from bench/fidelity.py's report section, so this table quotes the live
    run it was compared with instead of a copy of its figures."""
    text = report.read_text()
    section = text.split("<!-- fidelity:start -->", 1)[1].split("<!-- fidelity:end -->", 1)[0]
    found = re.findall(r"^(\S+) +[0-9.]+ +([0-9.]+) +[-+][0-9.]+%$", section, re.MULTILINE)
    rates = {dep: float(rate) for dep, rate in found}
    missing = ", ".join(c["deployment"] for c in CASES if c["deployment"] not in rates)
    if not missing:
        return rates
    raise SystemExit(f"{report}: no live saturation figure for {missing}")  # stop, saying so


def grid(duration_s: float) -> Grid:
    return Grid.of(
        "paper",
        fixed={"duration": f"{duration_s:g}s", "checkers": [], "workload.arrivals.load": 1.2},
        cases=CASES,
    )


def measure(run: Run) -> tuple[float, float]:
    """(the planner's lambda_max, the sim's saturation throughput), req/s."""
    return run.plan.plan.lambda_max_rps, completion_rate(
        run.records, *steady_window(run.duration_s)
    )


def table(g: Grid, jobs: int = 1) -> list[str]:
    out = [
        "| deployment | planner | sim | sim vs planner | live | sim vs live |",
        "|---|---|---|---|---|---|",
    ]
    live = live_rates()
    for row in run_experiment(g, measure, jobs=jobs, checkers=False):
        dep = row.setting("deployment") or ""
        planned, rate = row.value
        out.append(
            f"| {dep} | {planned:.2f} | {rate:.2f} | {rate / planned - 1:+.1%} | {live[dep]:.2f} | "
            f"{rate / live[dep] - 1:+.1%} |"
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--duration", type=parse_duration, default=600.0)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument(
        "--lengths",
        type=lambda s: tuple(parse_duration(x) for x in s.split(",") if x),
        default=LENGTHS,
        help="prfaas-pd's other run lengths, comma-separated (empty: none)",
    )
    ap.add_argument("--report", type=Path, help="write the table, with provenance, here")
    args = ap.parse_args()
    load_before = os.getloadavg()
    g = grid(args.duration)
    text = report(g, args.duration, args.jobs, args.lengths)
    print(text, end="")
    if args.report:
        seed = g.scenario_of().seed
        setup = f"sim; paper.yaml's seed ({seed}); {args.jobs} job(s)"
        head = provenance("bench/sim_saturation.py", sys.argv[1:], load_before, setup)
        title, rest = text.split("\n", 1)
        args.report.write_text(f"{title}\n\n{head}{rest}")
    return 0


LENGTHS = (120.0, 1200.0)
"""Run lengths (real-world s) the second table runs prfaas-pd for."""


def lengths_table(lengths: tuple[float, ...], jobs: int = 1) -> list[str]:
    """prfaas-pd's saturation on the sim for each run length, against the planner."""
    out = [
        "",
        "prfaas-pd at other run lengths (sim; the steady window is the run's last five sixths):",
        "",
        "| run length | planner | sim | sim vs planner |",
        "|---|---|---|---|",
    ]
    g = Grid.of(
        "paper",
        fixed={"checkers": [], "workload.arrivals.load": 1.2, **CASES[0]},
        cases=[{"duration": f"{d:g}s"} for d in lengths],
    )
    rows = run_experiment(g, measure, jobs=jobs, checkers=False)
    for d, row in zip(lengths, rows, strict=True):
        planned, rate = row.value
        out.append(f"| {d:.0f} s | {planned:.2f} | {rate:.2f} | {rate / planned - 1:+.1%} |")
    return out


def report(g: Grid, duration_s: float, jobs: int = 1, lengths: tuple[float, ...] = LENGTHS) -> str:
    """The report's text without its provenance: a title line, then the tables."""
    title = f"# Saturation at 120% of lambda_max, {duration_s:.0f}s real-world, sim vs live"
    return "\n".join([title, "", *table(g, jobs), *lengths_table(lengths, jobs)]) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
