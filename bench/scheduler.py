"""The scheduler live: what the short-term and long-term loops buy, policy against policy.

Two experiments on the local substrate (real processes, shaped link), each policy on the same
seed, so every run sees the same requests and the same fault at the same time:

1. bandwidth drop (scenarios/bandwidth-drop.yaml): the link falls from 100 to 5 Gbps for 60 s;
   for each load, P90 TTFT of the requests that arrived in the 60 s before the drop and of those
   that arrived during it, their ratio, when t first rose after the drop and first fell after
   the recovery, the PD split reached, and failures. The planner's lambda_max at 5 Gbps with
   the best split is printed too: a load above it cannot be carried through the drop by any
   policy, only queued.
2. traffic shift (scenarios/traffic-shift.yaml): prompts shift from short- to long-dominated;
   completions per second after the long-term loop had time to act, against the planner's new
   optimum, with and without the long-term loop.

Usage: python bench/scheduler.py [--loads 0.5,0.9] [--only drop|shift] [--report FILE]
About 10 minutes on 2 cores with the defaults. --report FILE writes the tables as markdown into
FILE's `scheduler-live` section (the rest of FILE is kept).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from provenance import (  # bench/provenance.py: the script's directory is on sys.path
    markdown_section,
)

from testbed.experiment import Grid, completion_rate, run_scenario_once, ttft_p90
from testbed.metrics.records import HistoryEvent, RequestRecord
from testbed.planner import plan_deployment, plan_inputs
from testbed.scenario.schema import Scenario, load_scenario

ROOT = Path(__file__).resolve().parents[1]
DROP_SCENARIO = ROOT / "scenarios" / "bandwidth-drop.yaml"
DROP_POLICIES = ("prfaas", "prfaas-nolongterm", "prfaas-static", "naive")
SHIFT_POLICIES = ("prfaas", "prfaas-nolongterm")


def _run(scenario: Scenario, policy: str) -> tuple[Any, list[RequestRecord], list[HistoryEvent]]:
    run = run_scenario_once(scenario, "local", policy=policy)
    return run.plan, run.records, run.history


def _threshold_moves(history: list[HistoryEvent], t0: float, t1: float) -> tuple[Any, Any]:
    """First time t rose after t0 and first time it fell after t1 (seconds after each)."""
    seq = [(e.t, e.data["threshold_tokens"]) for e in history if e.kind == "threshold"]
    before = [v for t, v in seq if t < t0]
    base = before[-1] if before else None
    rose = next((t - t0 for t, v in seq if t >= t0 and base is not None and v > base), None)
    at_t1 = [v for t, v in seq if t < t1]
    peak = at_t1[-1] if at_t1 else None
    fell = next((t - t1 for t, v in seq if t >= t1 and peak is not None and v < peak), None)
    return rose, fell


def bandwidth_drop(loads: list[float]) -> list[dict[str, Any]]:
    base = load_scenario(DROP_SCENARIO)
    fault = next(e for e in base.nemesis if e.action == "bandwidth")
    start = fault.at
    bandwidth = getattr(fault, "bandwidth", None)
    assert fault.for_ is not None and bandwidth is not None
    end = start + fault.for_
    dep = next(iter(base.deployments.values()))
    narrow = plan_deployment("prfaas-pd", dep, plan_inputs(base), link_bytes_per_s=bandwidth)
    rows = []
    for load in loads:
        scenario = Grid.of(DROP_SCENARIO, fixed={"workload.arrivals.load": load}).scenario_of()
        for policy in DROP_POLICIES:
            print(f"bandwidth drop: {policy} at {load:.0%} ...", file=sys.stderr)
            rp, recs, hist = _run(scenario, policy)
            pre, during = ttft_p90(recs, start - fault.for_, start), ttft_p90(recs, start, end)
            rose, fell = _threshold_moves(hist, start, end)
            splits = [e.data["n_prefill"] for e in hist if e.kind == "split"]
            rows.append(
                {
                    "load": load,
                    "policy": policy,
                    "offered_rps": rp.rate_rps,
                    "narrow_lambda_max_rps": narrow.lambda_max_rps,
                    "narrow_split": f"{narrow.n_prefill}/{narrow.n_decode}",
                    "p90_before_s": pre,
                    "p90_during_s": during,
                    "ratio": during / pre if pre and during else None,
                    "t_rose_after_s": rose,
                    "t_fell_after_s": fell,
                    "splits": splits,
                    "start_split": f"{rp.n_prefill}/{rp.n_decode}",
                    "failed": sum(1 for r in recs if r.status != "completed"),
                    "requests": len(recs),
                }
            )
    return rows


def traffic_shift() -> list[dict[str, Any]]:
    base = load_scenario(ROOT / "scenarios" / "traffic-shift.yaml")
    check = next(c for c in base.checkers if c.check == "throughput")
    after, until = getattr(check, "after", None), getattr(check, "until", None)
    assert after is not None and until is not None
    rows = []
    for policy in SHIFT_POLICIES:
        print(f"traffic shift: {policy} ...", file=sys.stderr)
        rp, recs, hist = _run(base, policy)
        rate = completion_rate(recs, after, until)
        assert rp.shift_plan is not None
        splits = [(round(e.t), e.data["n_prefill"]) for e in hist if e.kind == "split"]
        rows.append(
            {
                "policy": policy,
                "window": f"{after:g}-{until:g}s",
                "completed_rps": rate,
                "optimum_rps": rp.shift_plan.lambda_max_rps,
                "optimum_split": f"{rp.shift_plan.n_prefill}/{rp.shift_plan.n_decode}",
                "error": rate / rp.shift_plan.lambda_max_rps - 1,
                "start_split": f"{rp.n_prefill}/{rp.n_decode}",
                "splits": splits,
                "failed": sum(1 for r in recs if r.status != "completed"),
            }
        )
    return rows


def _f(v: float | None, spec: str, unit: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{unit}"


def render(drop: list[dict[str, Any]], shift: list[dict[str, Any]]) -> str:
    out: list[str] = []
    if r0 := next(iter(drop), None):  # the planner's figures, the same on every row
        out += [
            "### Bandwidth drop: 100 -> 5 Gbps for 60 s\n",
            f"Planner at 5 Gbps, best split {r0['narrow_split']}: lambda_max "
            f"{r0['narrow_lambda_max_rps']:.2f} req/s; above that no policy carries the load "
            "through the drop.\n",
            "| load | policy | offered req/s | P90 TTFT before | during | ratio | t up after "
            "drop | t down after recovery | PD split (start -> changes) | failed |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in drop:
            out.append(
                f"| {r['load']:.0%} | {r['policy']} | {r['offered_rps']:.2f} | "
                f"{_f(r['p90_before_s'], '.1f', ' s')} | {_f(r['p90_during_s'], '.1f', ' s')} | "
                f"{_f(r['ratio'], '.2f', 'x')} | {_f(r['t_rose_after_s'], '.1f', ' s')} | "
                f"{_f(r['t_fell_after_s'], '.1f', ' s')} | {r['start_split']} -> "
                f"{','.join(map(str, r['splits'])) or '-'} | {r['failed']}/{r['requests']} |"
            )
        out.append("")
    if shift:
        out += [
            "### Traffic shift: short- to long-dominated prompts\n",
            "| policy | window | completed req/s | planner's new optimum | error | PD split "
            "(start -> (t, N_p)) | failed |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in shift:
            out.append(
                f"| {r['policy']} | {r['window']} | {r['completed_rps']:.2f} | "
                f"{r['optimum_rps']:.2f} ({r['optimum_split']}) | {r['error']:+.1%} | "
                f"{r['start_split']} -> {r['splits'] or '-'} | {r['failed']} |"
            )
        out.append("")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--loads", default="0.5,0.9", help="bandwidth drop loads (of lambda_max)")
    ap.add_argument("--only", choices=("drop", "shift"))
    ap.add_argument("--report", type=Path, help="also write the tables to this markdown file")
    ap.add_argument("--json", type=Path, help="also write the raw rows as JSON")
    args = ap.parse_args()
    load_before = os.getloadavg()
    loads = [float(x) for x in args.loads.split(",") if x]
    drop = bandwidth_drop(loads) if args.only in (None, "drop") else []
    shift = traffic_shift() if args.only in (None, "shift") else []
    text = render(drop, shift)
    print(text)
    if args.report:
        setup = (
            f"local (live), the scenarios' own seeds; bandwidth-drop at loads {args.loads}, "
            "traffic-shift"
        )
        heading = "Bandwidth drop and traffic shift, live"
        markdown_section(args.report, "scheduler-live", heading, load_before, setup, text)
    if args.json:
        args.json.write_text(json.dumps({"drop": drop, "shift": shift}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
