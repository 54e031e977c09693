"""`testbed sweep SCENARIO --set path=v1,v2 [--set ...]`: a grid of what-ifs on the sim.

Writes sweep.csv, sweep.md and sweep.png to `--out` (default results/sweep-NAME/) and prints the
table; each cell's saturation throughput sits next to the planner's lambda_max, and cells more
than 10% apart are flagged (testbed.scenario.sweep).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from testbed.cli.run import add_max_requests
from testbed.metrics.sweep import write_sweep
from testbed.scenario.library import resolve_scenario
from testbed.scenario.sweep import cells, parse_set, run_grid


def _run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    path = resolve_scenario(args.scenario)
    axes = [parse_set(text) for text in args.set]
    todo = cells(path, axes, saturation=not args.no_saturation, max_requests=args.max_requests)
    out = Path(args.out) if args.out else Path("results") / f"sweep-{path.stem}"
    jobs = args.jobs or min(len(todo), os.cpu_count() or 1)
    where = f"Ray at {args.ray}" if args.ray else f"{jobs} local process(es)"
    print(f"testbed: sweep {path.stem}: {len(todo)} cells on the sim, {where}", file=sys.stderr)

    def show(i: int, row: dict[str, Any]) -> None:
        if args.quiet:
            return
        label = ", ".join(f"{a.path.rsplit('.', 1)[-1]}={row[a.path]}" for a in axes)
        sat = row.get("sim_saturation_rps")
        extra = (
            f", saturation {sat:.2f} vs planner {row['planner_lambda_max_rps']:.2f}" if sat else ""
        )
        print(
            f"[{i + 1}/{len(todo)}] {label}: goodput {row['goodput_rps']:.2f} req/s, "
            f"TTFT p90 {row['ttft_p90_s'] or 0:.2f}s{extra}",
            file=sys.stderr,
            flush=True,
        )

    rows = run_grid(todo, jobs=jobs, ray_address=args.ray, on_row=show)
    title = f"sweep of {path.stem}: " + "; ".join(f"{a.path} = {', '.join(a.values)}" for a in axes)
    write_sweep(rows, [a.path for a in axes], out, title)
    print((out / "sweep.md").read_text())
    flagged = sum(1 for r in rows if r.get("flagged"))
    print(
        f"results: {out}/ (sweep.csv, sweep.md, sweep.png); {len(rows)} cells, {flagged} flagged; "
        f"{time.perf_counter() - started:.1f}s wall"
    )
    return 0


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "sweep",
        help="run a grid of what-ifs on the sim and tabulate them",
        description="Simulate a scenario over every combination of --set values (keys are the "
        "scenario file's own paths, e.g. deployments.prfaas-pd.link.bandwidth=10Gbps,100Gbps) "
        "and write sweep.csv, sweep.md and sweep.png: goodput, TTFT, SLO attainment, and the "
        "sim's saturation throughput next to the planner's lambda_max per cell.",
    )
    p.add_argument("scenario", help="scenario YAML file, or a library name")
    p.add_argument(
        "--set",
        action="append",
        required=True,
        metavar="PATH=V1,V2",
        help="a field of the scenario file and the values it takes (repeat for more axes)",
    )
    p.add_argument("--out", metavar="DIR", help="output directory (default results/sweep-NAME)")
    p.add_argument("--jobs", type=int, metavar="N", help="local processes (default: cores)")
    p.add_argument("--ray", metavar="ADDRESS", help="run the cells on this Ray cluster instead")
    p.add_argument(
        "--no-saturation",
        action="store_true",
        help="skip each cell's saturation run (120%% of lambda_max): half the time",
    )
    p.add_argument("--quiet", action="store_true", help="no line per finished cell")
    add_max_requests(p)
    p.set_defaults(func=_run)
