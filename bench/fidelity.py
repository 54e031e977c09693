"""Live vs planned: does each of the paper's deployments saturate where the planner says?

For prfaas-pd (prfaas-static), homogeneous and naive from scenarios/paper.yaml, runs the
deployment live at 80% and at 120% of the planner's lambda_max (uniform arrivals, the paper's
workload) and prints, side by side:
- whether the run kept pace: completions per second over the steady window vs the offered rate,
  and how much the backlog (arrived, not finished) grew over that window;
- the measured saturation throughput: the completion rate over the steady window of the 120%
  run, where the bottleneck stage runs flat out, against the planner's lambda_max;
- goodput at the TTFT SLO, and PrfaaS-PD's gain over the two baselines.

Usage: python bench/fidelity.py [--duration 600] [--time-scale 10] [--only prfaas-pd]
                                [--policy prfaas-static] [--loads 0.8,1.2] [--runs 1]
                                [--set PATH=VALUE ...] [--report FILE]
`--policy` is PrfaaS-PD's routing policy (homogeneous and naive have one each); `--runs N`
repeats every case with seeds seed, seed+1, ... and reports the mean (and each run); `--set`
replaces a field of scenarios/paper.yaml for every run, as `testbed run --set` does (e.g.
`--set policy.predict.triage_weight=30`).
`--report FILE` also writes the tables, under their provenance header, as a section of FILE
(bench/reports/fidelity.md; one section per PrfaaS-PD policy), the rest of FILE kept.
Takes about 8 minutes on 2 cores with the defaults.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from provenance import output_section, printed, provenance  # bench/ is on sys.path

from testbed.cli.run import add_set
from testbed.errors import UserError
from testbed.experiment import (
    Grid,
    backlog,
    completion_rate,
    headline,
    run_scenario_once,
    steady_window,
)

ROOT = Path(__file__).resolve().parents[1]
CASES = (("prfaas-pd", "prfaas-static"), ("homogeneous", "homogeneous"), ("naive", "naive"))


def run_case(
    base: Grid,
    seed: int,
    deployment: str,
    policy: str,
    load: float,
    args: argparse.Namespace,
    run: int = 0,
) -> dict:
    """`base` (scenarios/paper.yaml with any --set written in; `seed` its seed) on `deployment`
    at `load`, live."""
    scenario = base.with_fixed(
        {
            "seed": seed + run,
            "scale.time_scale": args.time_scale,
            "scale.byte_scale": args.byte_scale,
            "deployment": deployment,
            "workload.arrivals.load": load,
            "duration": f"{args.duration:g}s",
        }
    ).scenario_of()
    result = run_scenario_once(scenario, "local", policy=policy)
    rp, recs, h = result.plan, result.records, headline(result.summary)
    lo, hi = steady_window(args.duration)
    return {
        "planned": rp.plan.lambda_max_rps,
        "offered": rp.rate_rps,
        "completed_rate": completion_rate(recs, lo, hi),
        "backlog_growth": backlog(recs, hi) - backlog(recs, lo),
        "goodput": h["goodput_rps"],
        "ttft_p90": h["ttft_p90_s"],
        "failed": h["failed"],
        "checks_ok": result.ok,
    }


def say(line: str) -> None:
    """A progress line on stderr (the table goes to stdout)."""
    print(line, file=sys.stderr, flush=True)


def mean_row(runs: list[dict]) -> dict:
    """The runs of one case averaged (numbers; counts summed), each run's rate kept."""
    out = dict(runs[0])
    for key in ("completed_rate", "goodput", "offered", "planned"):
        out[key] = sum(r[key] for r in runs) / len(runs)
    ttfts = [r["ttft_p90"] for r in runs if r["ttft_p90"] is not None]
    out["ttft_p90"] = sum(ttfts) / len(ttfts) if ttfts else None
    out["backlog_growth"] = round(sum(r["backlog_growth"] for r in runs) / len(runs))
    out["failed"] = sum(r["failed"] for r in runs)
    out["checks_ok"] = all(r["checks_ok"] for r in runs)
    out["each"] = [r["completed_rate"] for r in runs]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--duration", type=float, default=600.0, help="real-world seconds per run")
    ap.add_argument("--time-scale", type=float, default=10.0)
    ap.add_argument("--byte-scale", type=float, default=1000.0)
    ap.add_argument("--only", choices=[c[0] for c in CASES])
    ap.add_argument("--policy", default="prfaas-static", help="PrfaaS-PD's routing policy")
    ap.add_argument(
        "--loads", default="0.8,1.2", help="loads to run, fractions of lambda_max (1.2 saturates)"
    )
    ap.add_argument("--runs", type=int, default=1, help="runs per case (seeds seed, seed+1, ...)")
    ap.add_argument("--report", type=Path, metavar="FILE", help="also write the tables here")
    add_set(
        ap,
        "a field of scenarios/paper.yaml replaced for every run (repeatable), e.g. "
        "policy.predict.triage_weight=30",
    )
    args = ap.parse_args()
    try:
        settings = args.settings
        base = Grid(str(ROOT / "scenarios" / "paper.yaml"), tuple(settings))
        seed = base.scenario_of().seed
    except UserError as e:
        ap.error(str(e))
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    try:
        loads = [float(x) for x in args.loads.split(",")]
    except ValueError:
        ap.error(f"--loads: expected comma-separated numbers such as 0.8,1.2, got {args.loads!r}")
    load_before = os.getloadavg()
    rows = {}
    for deployment, policy in CASES:
        if args.only and deployment != args.only:
            continue
        if deployment == "prfaas-pd":
            policy = args.policy
        for load in loads:
            runs = []
            for i in range(args.runs):
                run = f"run {i + 1}/{args.runs}"
                say(f"running {deployment} ({policy}) at {load:.0%} of lambda_max, {run} ...")
                try:
                    runs.append(run_case(base, seed, deployment, policy, load, args, i))
                except UserError as e:  # e.g. --duration shorter than paper.yaml's checkers
                    say(f"fidelity.py: error: {e}")
                    return 2
                say(f"  completed {runs[-1]['completed_rate']:.3f} req/s")
            rows[(deployment, load)] = mean_row(runs)
    with printed() as out:
        tables(rows, args, settings)
    if args.report is not None:
        setup = (
            f"local processes; scenarios/paper.yaml, seeds {seed}..{seed + args.runs - 1}; "
            f"{args.only or 'prfaas-pd, homogeneous, naive'} (prfaas-pd under {args.policy}); "
            f"loads {args.loads} of "
            f"lambda_max; time_scale {args.time_scale:g}, byte_scale {args.byte_scale:g}, "
            f"{args.duration:g} s real-world per run"
            + "".join(f"; --set {p}={v}" for p, v in settings)
        )
        head = provenance("bench/fidelity.py", sys.argv[1:], load_before, setup)
        name = "fidelity" if args.policy == "prfaas-static" else f"fidelity-{args.policy}"
        heading = f"Live vs planned, PrfaaS-PD under {args.policy}"
        output_section(args.report, name, heading, head, out.getvalue())
    return 0


def tables(rows: dict, args: argparse.Namespace, settings: list) -> None:
    """Print the pace table, the saturation table and PrfaaS-PD's gain (when all three ran)."""
    knobs = "".join(f", {p}={v}" for p, v in settings)
    print(
        f"\nfidelity: live vs planner (prfaas-pd under {args.policy}{knobs}, "
        f"time_scale {args.time_scale:g}, byte_scale "
        f"{args.byte_scale:g}, {args.duration:g}s real per run, steady window from "
        f"{steady_window(args.duration)[0]:g}s)\n"
    )
    hdr = (
        f"{'deployment':12} {'load':>5} {'offered':>8} {'done/s':>7} {'keeps pace':>10} "
        f"{'backlog +':>9} {'goodput':>8} {'TTFT p90':>9} {'failed':>6} {'checks':>6}"
    )
    print(hdr)
    print("-" * len(hdr))
    for (dep, load), r in rows.items():
        pace = r["completed_rate"] >= 0.95 * r["offered"]
        ttft = f"{r['ttft_p90']:.2f}s" if r["ttft_p90"] is not None else "-"
        print(
            f"{dep:12} {load:>5.0%} {r['offered']:>8.2f} {r['completed_rate']:>7.2f} "
            f"{('yes' if pace else 'no'):>10} {r['backlog_growth']:>9d} {r['goodput']:>8.2f} "
            f"{ttft:>9} {r['failed']:>6d} {('ok' if r['checks_ok'] else 'FAIL'):>6}"
        )
    print(f"\n{'deployment':12} {'planned':>8} {'measured':>9} {'error':>7}")
    measured = {}
    for dep, _ in CASES:
        if (dep, 1.2) not in rows:
            continue
        r = rows[(dep, 1.2)]
        measured[dep] = r["completed_rate"]
        err = r["completed_rate"] / r["planned"] - 1
        each = " ".join(f"{x:.3f}" for x in r["each"])
        print(
            f"{dep:12} {r['planned']:>8.2f} {r['completed_rate']:>9.2f} {err:>+7.1%}"
            + (f"  (runs: {each})" if len(r["each"]) > 1 else "")
        )
    if len(measured) == 3:
        vs_h = measured["prfaas-pd"] / measured["homogeneous"]
        vs_n = measured["prfaas-pd"] / measured["naive"]
        print(
            f"\nPrfaaS-PD saturation throughput = {vs_h:.2f}x homogeneous, {vs_n:.2f}x naive "
            "(paper's model: 1.54x and 1.32x)"
        )


if __name__ == "__main__":
    raise SystemExit(main())
