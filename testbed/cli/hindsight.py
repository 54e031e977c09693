"""`testbed hindsight SCENARIO`: the best fixed threshold (and PD split) in hindsight, on the sim.

A preset of `testbed sweep` (testbed.scenario.hindsight): prfaas-static at each threshold of a
log-spaced grid around the planner's t and each PD split near the running one, fixed over the
whole run, for every seed; writes hindsight.csv, hindsight.md and hindsight.json to `--out`
(default results/hindsight-NAME/) and prints the table and the best setting.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from testbed.cli.run import add_max_requests, add_set
from testbed.errors import UserError
from testbed.metrics.scorecard import hindsight_markdown, write_hindsight
from testbed.scenario.hindsight import OBJECTIVES, Objective, best_fixed
from testbed.scenario.library import resolve_scenario
from testbed.scenario.schema import load_scenario
from testbed.scenario.sweep import scenario_with_settings
from testbed.substrates import substrates_with
from testbed.units import UnitError, parse_tokens


def int_list(text: str) -> list[int]:
    """`1,2,3` (seeds, PD-P counts)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: integers separated by commas") from None
    if not values:
        raise argparse.ArgumentTypeError("an empty list")
    return values


def _tokens_list(text: str) -> list[float]:
    try:
        values = [parse_tokens(v.strip()) for v in text.split(",") if v.strip()]
    except UnitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: positive token counts, e.g. 10K,19.5K,40K")
    return values


def _run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    if args.substrate not in substrates_with(lambda s: s.hindsight):
        raise UserError("hindsight runs on the sim substrate only (it sweeps a whole grid)")
    path = resolve_scenario(args.scenario)
    scenario = scenario_with_settings(path, args.settings) if args.settings else load_scenario(path)
    objective: Objective = args.objective or ("ttft-p90-fault" if scenario.nemesis else "goodput")
    out = Path(args.out) if args.out else Path("results") / f"hindsight-{path.stem}"

    def show(i: int, row: dict[str, Any]) -> None:
        if args.quiet:
            return
        w = row["ttft_p90_window_s"]
        print(
            f"[{i + 1}] t={row['threshold_tokens']:.0f} {row['n_prefill']}/{row['n_decode']} "
            f"seed {row['seed']}: goodput {row['goodput_rps']:.3f} req/s, TTFT p90 fault window "
            f"{'inf' if w is None else f'{w:.2f}s'}",
            file=sys.stderr,
            flush=True,
        )

    print(f"testbed: hindsight {path.stem} on the sim, objective {objective}", file=sys.stderr)
    result = best_fixed(
        path,
        args.seeds,
        objective,
        thresholds=args.thresholds,
        splits=args.splits,
        sweep_split=not args.no_splits,
        jobs=args.jobs,
        on_row=show,
        overrides=args.settings,
        max_requests=args.max_requests,
    )
    data = result.to_json()
    write_hindsight(data, out)
    print(hindsight_markdown(data))
    b = result.best
    print(
        f"best fixed setting: threshold {b['threshold_tokens']:.0f} tokens, {b['n_prefill']} PD-P "
        f"/ {b['n_decode']} PD-D ({objective} {b['objective_value']:.3f})"
    )
    print(
        f"results: {out}/ (hindsight.csv, hindsight.md, hindsight.json); {len(result.rows)} runs, "
        f"{time.perf_counter() - started:.1f}s wall"
    )
    return 0


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "hindsight",
        help="find the best fixed threshold (and PD split) of a scenario in hindsight, on the sim",
        description="Simulate a scenario with prfaas-static at each fixed threshold (and PD "
        "split) of a grid, for every seed, and keep the best by the objective: P90 TTFT over "
        "the fault window, or goodput at the SLO. Writes hindsight.csv, hindsight.md and "
        "hindsight.json.",
    )
    p.add_argument("scenario", help="scenario YAML file, or a library name")
    p.add_argument("--substrate", default="sim", help="sim (the only one a grid runs on)")
    p.add_argument(
        "--thresholds",
        type=_tokens_list,
        metavar="LIST",
        help="thresholds in tokens, e.g. 10K,19.5K,40K (default: 8 values from 1/4 to 2.8 times "
        "the planner's t, log-spaced)",
    )
    p.add_argument(
        "--splits",
        type=int_list,
        metavar="LIST",
        help="PD-P counts of the local cluster (same total), e.g. 2,3,4 (default: the running "
        "split and one either side)",
    )
    p.add_argument(
        "--no-splits", action="store_true", help="keep the running PD split (thresholds only)"
    )
    p.add_argument(
        "--seeds", type=int_list, default=[1, 2, 3], metavar="LIST", help="default 1,2,3"
    )
    p.add_argument(
        "--objective",
        choices=OBJECTIVES,
        help="what 'best' means (default: ttft-p90-fault when the scenario has faults, else "
        "goodput)",
    )
    add_set(p)
    p.add_argument("--out", metavar="DIR", help="output directory (default results/hindsight-NAME)")
    p.add_argument("--jobs", type=int, metavar="N", help="local processes (default: cores)")
    p.add_argument("--quiet", action="store_true", help="no line per finished run")
    add_max_requests(p)
    p.set_defaults(func=_run)
