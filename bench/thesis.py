"""The paper's thesis, live: hybrid-attention KV crosses datacenters, dense KV does not.

Runs scenarios/thesis.yaml's three deployments (the paper's PrfaaS-PD deployment and workload over
one 100 Gbps link, each model offered the same 2.58 req/s: 80% of the hybrid model's lambda_max)
under `prfaas-static` with t fixed at the paper's 19.5K and under the bandwidth-aware `prfaas` and
`prfaas-predict`, and prints side by side: the link's mean use over the steady window, TTFT p90
(all, and of the PrfaaS-routed requests), goodput at the SLO and SLO attainment. Then:
- the planner's figures for each model at t = 19.5K (lambda_max, link use, the highest rate the
  link carries) and the link bandwidth at which the dense model becomes viable at 2.58 req/s
  (with t fixed at 19.5K, and with t chosen by the planner);
- the same question on the sim: the smallest link (10 Gbps steps) at which the dense model,
  offered 2.58 req/s under prfaas-static, keeps TTFT p90 within the SLO (t = 19.5K, and the
  planner's t at each bandwidth);
- the dense model's live saturation at t = 19.5K (completion rate over the steady window when
  offered 120% of the planner's rate for that setting) against the planner's figure;
- a plot of link use and TTFT p90 per model and policy (bench/reports/thesis.png) and the table
  (bench/reports/thesis.md).

Usage: python bench/thesis.py [--duration 240s] [--substrate local|sim] [--policies LIST]
                              [--skip-saturation] [--skip-sim-sweep] [--models LIST]
About 6 minutes on 2 cores with the defaults (live runs); under 30 s with --substrate sim.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
from provenance import provenance  # bench/provenance.py: the script's directory is on sys.path

from testbed.experiment import (
    SUBSTRATES,
    Grid,
    Run,
    Substrate,
    completion_rate,
    headline,
    in_window,
    percentile,
    run_scenario_once,
    steady_window,
)
from testbed.experiment.grid import Value
from testbed.metrics.records import HistoryEvent, RequestRecord
from testbed.planner import plan_deployment, plan_inputs
from testbed.scenario.hindsight import best_fixed
from testbed.scenario.schema import Scenario, load_scenario
from testbed.units import parse_duration

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "thesis.yaml"
REPORTS = ROOT / "bench" / "reports"
POLICIES = ("prfaas-static", "prfaas", "prfaas-predict")
"""prfaas-static (t fixed at 19.5K) and the two bandwidth-aware policies."""
PAPER_T = 19_500.0
DENSE = "minimax-m2.5"


def variant(
    deployment: str,
    *,
    duration: float,
    rate: float | None = None,
    gbps: float | None = None,
    threshold: float | str | None = None,
) -> Scenario:
    """thesis.yaml on `deployment` for `duration`, without checkers; `rate` replaces the
    arrival rate, `gbps` the deployment's link bandwidth, `threshold` the policy's (written as
    `--set` settings, validated as the file is)."""
    values: dict[str, Value] = {
        "deployment": deployment,
        "duration": f"{duration:g}s",
        "checkers": [],
    }
    if rate is not None:
        values["workload.arrivals.rate"] = rate
    if gbps is not None:
        values[f"deployments.{deployment}.link.bandwidth"] = f"{gbps:g}Gbps"
    if threshold is not None:
        values["policy.threshold"] = threshold
    return Grid.of(SCENARIO, fixed=values).scenario_of()


def link_use(history: list[HistoryEvent], lo: float, hi: float) -> tuple[float, float]:
    """Mean and peak Gbps of the link samples inside [lo, hi] (real-world, as the report)."""
    gbps = [e.data["gbps"] for e in history if e.kind == "link" and lo <= e.t <= hi]
    configured = [e.data["configured_gbps"] for e in history if e.kind == "link"]
    mean = float(np.mean(gbps)) if gbps else 0.0
    return mean, mean / (configured[0] if configured else 100.0)


def run(scenario: Scenario, policy: str, substrate: Substrate) -> tuple[Any, Run]:
    result = run_scenario_once(scenario, substrate, policy=policy)
    return result.plan, result


def measure(scenario: Scenario, policy: str, substrate: Substrate) -> dict[str, Any]:
    rp, result = run(scenario, policy, substrate)
    lo, hi = steady_window(scenario.duration)
    recs: list[RequestRecord] = result.records
    steady = in_window(recs, lo, hi)
    ttft = [r.ttft for r in steady if r.ttft is not None]
    prfaas = [r.ttft for r in steady if r.ttft is not None and r.route == "prfaas"]
    mean_gbps, use = link_use(result.history, lo, hi)
    thresholds = [e.data["threshold_tokens"] for e in result.history if e.kind == "policy"]
    h = headline(result.summary)
    return {
        "offered": rp.rate_rps,
        "link_gbps": mean_gbps,
        "link_use": use,
        "ttft_p90": percentile(ttft, 90),
        "prfaas_ttft_p90": percentile(prfaas, 90),
        "prfaas_share": len(prfaas) / len(ttft) if ttft else 0.0,
        "goodput": h["goodput_rps"],
        "slo_attainment": h["slo_attainment"],
        "failed": h["failed"],
        "submitted": h["requests"],
        "t_end": thresholds[-1] if thresholds else None,
    }


def viable_bandwidth(base: Scenario, deployment: str, rate: float, t: float | None) -> float | None:
    """Smallest link (Gbps, 1 Gbps steps up to 2 Tbps) whose plan carries `rate`."""
    dep = base.deployments[deployment]
    inputs = plan_inputs(base)

    def carries(gbps: int) -> bool:
        link = gbps * 1e9 / 8
        plan = plan_deployment(deployment, dep, inputs, link_bytes_per_s=link, threshold_tokens=t)
        return plan.lambda_max_rps >= rate

    return next((float(gbps) for gbps in range(1, 2001) if carries(gbps)), None)


def viable_bandwidth_sim(
    base: Scenario, duration: float, threshold: float | str, slo: float
) -> tuple[float | None, list[tuple[float, float | None]]]:
    """Smallest link (10 Gbps steps from 100 to 400) at which the dense model, offered the
    scenario's rate on the sim under prfaas-static, keeps TTFT p90 (all requests and the
    PrfaaS-routed ones) within the SLO over the steady window; with each step's TTFT p90."""
    steps: list[tuple[float, float | None]] = []
    for gbps in range(100, 401, 10):
        scenario = variant(DENSE, duration=duration, gbps=gbps, threshold=threshold)
        r = measure(scenario, "prfaas-static", "sim")
        worst = max(r["ttft_p90"] or 0.0, r["prfaas_ttft_p90"] or 0.0)
        steps.append((float(gbps), worst))
        if r["failed"] == 0 and worst <= slo:
            return float(gbps), steps
    return None, steps


def hindsight_goodput(base: Scenario, duration: float) -> list[tuple[float, float]]:
    """The dense model's goodput on the sim under prfaas-static at each fixed threshold of
    `testbed hindsight`'s grid (testbed.scenario.hindsight.default_thresholds: the planner's t
    x 1/4 ... 2.83; the running PD split, the scenario's seed and rate): its search
    (testbed.scenario.hindsight.best_fixed) on the dense deployment."""
    result = best_fixed(
        SCENARIO,
        [base.seed],
        "goodput",
        sweep_split=False,
        overrides=[("deployment", DENSE), ("duration", f"{duration:g}s")],
    )
    return [(s["threshold_tokens"], s["goodput_rps"]) for s in result.settings]


def fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def plot(
    rows: list[tuple[str, str, dict[str, Any]]], policies: list[str], slo: float, path: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(m for m, _, _ in rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(policies)
    for i, policy in enumerate(policies):
        cells = {m: r for m, p, r in rows if p == policy}
        xs = np.arange(len(models)) + (i - (len(policies) - 1) / 2) * width
        axes[0].bar(xs, [cells[m]["link_use"] * 100 for m in models], width, label=policy)
        axes[1].bar(xs, [cells[m]["ttft_p90"] or 0 for m in models], width, label=policy)
    axes[0].axhline(90, color="grey", ls=":", lw=1)
    axes[0].set_ylabel("link use, steady window (% of 100 Gbps)")
    axes[1].axhline(slo, color="red", ls="--", lw=1, label=f"TTFT SLO {slo:g}s")
    axes[1].set_ylabel("TTFT p90 (s)")
    axes[1].set_yscale("log")
    for ax in axes:
        ax.set_xticks(np.arange(len(models)), models)
        ax.legend(fontsize=8)
    fig.suptitle("Same deployment, link and rate (2.58 req/s): hybrid KV crosses, dense does not")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(reports: Path, lines: list[str], head: str) -> None:
    """thesis.md in `reports`: the title line, the provenance header `head`, the rest."""
    (reports / "thesis.md").write_text("\n".join([lines[0], "", head, *lines[1:]]) + "\n")
    print(f"wrote {reports / 'thesis.md'} and thesis.png")


def names(text: str) -> list[str]:
    """A comma-separated option's names (`--policies`, `--models`)."""
    return text.split(",")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--duration", type=parse_duration, default=240.0, help="real-world per run")
    ap.add_argument("--substrate", default="local", choices=SUBSTRATES)
    ap.add_argument(
        "--policies",
        default=",".join(POLICIES),
        type=names,
        help="comma-separated policies to run (default: %(default)s)",
    )
    ap.add_argument(
        "--models", type=names, help="comma-separated deployments of thesis.yaml (default: all)"
    )
    ap.add_argument("--skip-saturation", action="store_true")
    ap.add_argument(
        "--skip-sim-sweep",
        action="store_true",
        help="skip the sim's search for the link at which the dense model becomes viable",
    )
    ap.add_argument("--reports", type=Path, default=REPORTS, help="where thesis.md/.png go")
    args = ap.parse_args()
    load_before = os.getloadavg()
    base = load_scenario(SCENARIO)
    rate = base.workload.arrivals.rate or 0.0
    inputs = plan_inputs(base)
    policies: list[str] = args.policies
    lines = [f"# The paper's thesis, live ({args.substrate}, {args.duration:.0f}s per run)", ""]

    lines += ["## Planner, t fixed at 19.5K, 100 Gbps", ""]
    lines += ["| model | lambda_max | bottleneck | link use at lambda_max | link carries up to |"]
    lines += ["|---|---|---|---|---|"]
    for name, dep in base.deployments.items():
        p = plan_deployment(name, dep, inputs, threshold_tokens=PAPER_T)
        lines.append(
            f"| {name} | {p.lambda_max_rps:.2f} req/s | {p.bottleneck} | "
            f"{p.link_utilisation:.0%} | {fmt(p.link_max_rps, '.2f')} req/s |"
        )
    fixed = viable_bandwidth(base, DENSE, rate, PAPER_T)
    free = viable_bandwidth(base, DENSE, rate, None)
    lines += [
        "",
        f"{DENSE} becomes viable at {rate:g} req/s from {fmt(fixed, '.0f')} Gbps with t = 19.5K, "
        f"and from {fmt(free, '.0f')} Gbps with the planner's t.",
        "",
    ]
    if not args.skip_sim_sweep:
        slo = base.slo.ttft
        for label, t in (("t = 19.5K", PAPER_T), ("the planner's t", "auto")):
            found, steps = viable_bandwidth_sim(base, args.duration, t, slo)
            tried = ", ".join(f"{g:.0f}: {fmt(v, '.1f')}s" for g, v in steps)
            lines += [
                f"On the sim (prfaas-static, {label}, {args.duration:.0f}s, 10 Gbps steps), "
                f"{DENSE} at {rate:g} req/s keeps TTFT p90 within the {slo:g}s SLO from "
                f"{fmt(found, '.0f')} Gbps (worst of all/PrfaaS-routed TTFT p90 per step: "
                f"{tried}).",
                "",
            ]

    print("\n".join(lines), flush=True)

    rows: list[tuple[str, str, dict[str, Any]]] = []
    table = [
        "## Live runs",
        "",
        "| model | policy | link mean (Gbps) | link use | TTFT p90 | PrfaaS TTFT p90 | "
        "offloaded | goodput | SLO attainment | failed | final t |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(table), flush=True)
    models: list[str] = args.models or list(base.deployments)
    for name in models:
        for policy in policies:
            r = measure(variant(name, duration=args.duration), policy, args.substrate)
            rows.append((name, policy, r))
            line = (
                f"| {name} | {policy} | {r['link_gbps']:.1f} | {r['link_use']:.0%} | "
                f"{fmt(r['ttft_p90'], '.2f')}s | {fmt(r['prfaas_ttft_p90'], '.2f')}s | "
                f"{r['prfaas_share']:.0%} | {r['goodput']:.2f} req/s | "
                f"{r['slo_attainment']:.0%} | {r['failed']}/{r['submitted']} | "
                f"{fmt(r['t_end'], '.0f')} |"
            )
            table.append(line)
            print(line, flush=True)
    dense = {p: r for m, p, r in rows if m == DENSE}
    static = dense.get("prfaas-static")
    if static is not None and len(dense) > 1:
        best = plan_deployment(DENSE, base.deployments[DENSE], inputs).lambda_max_rps
        table += [""]
        for policy, r in dense.items():
            if policy == "prfaas-static":
                continue
            gain = r["goodput"] / max(static["goodput"], 1e-9)
            table.append(f"{DENSE}: goodput under {policy} / under prfaas-static = {gain:.2f}x")
        table += [
            f"(the planner's best for {DENSE} on this link, at any threshold, is {best:.2f} "
            f"req/s, {best / max(static['goodput'], 1e-9):.2f}x prfaas-static's goodput here; "
            f"{rate / best:.0%} of it is offered)",
            "",
        ]
        grid = hindsight_goodput(base, args.duration)
        t_best, g_best = max(grid, key=lambda tg: tg[1])
        table += [
            f"The best fixed threshold in hindsight (sim, prfaas-static, {args.duration:.0f}s): "
            f"t = {t_best / 1000:g}K, goodput {g_best:.2f} req/s "
            f"({g_best / max(static['goodput'], 1e-9):.2f}x prfaas-static's here; per t: "
            + ", ".join(f"{t / 1000:g}K: {g:.2f}" for t, g in grid)
            + ").",
            "",
        ]
        print("\n".join(table[-len(dense) - 3 :]), flush=True)

    if not args.skip_saturation:
        dep = base.deployments[DENSE]
        planned = plan_deployment(DENSE, dep, inputs, threshold_tokens=PAPER_T).lambda_max_rps
        sat = variant(DENSE, duration=args.duration, rate=1.2 * planned)
        _, result = run(sat, "prfaas-static", args.substrate)
        measured = completion_rate(result.records, *steady_window(args.duration))
        table += [
            "## Dense model, saturation at t = 19.5K",
            "",
            f"Offered {1.2 * planned:.2f} req/s (120% of the planner's {planned:.2f}); completed "
            f"{measured:.2f} req/s over the steady window: {measured / planned - 1:+.1%} against "
            "the planner.",
            "",
        ]
        print("\n".join(table[-4:]), flush=True)

    args.reports.mkdir(parents=True, exist_ok=True)
    plot(rows, policies, base.slo.ttft, args.reports / "thesis.png")
    setup = f"{args.substrate}; thesis.yaml's seed ({base.seed})"
    write_report(
        args.reports,
        [*lines, *table],
        provenance("bench/thesis.py", sys.argv[1:], load_before, setup),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
