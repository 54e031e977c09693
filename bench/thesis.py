"""The paper's thesis, live: hybrid-attention KV crosses datacenters, dense KV does not.

Runs scenarios/thesis.yaml's three deployments (the paper's PrfaaS-PD deployment and workload over
one 100 Gbps link, each model offered the same 2.58 req/s: 80% of the hybrid model's lambda_max)
under `prfaas-static` with t fixed at the paper's 19.5K and under the bandwidth-aware `prfaas`,
and prints side by side: the link's mean use over the steady window, TTFT p90 (all, and of the
PrfaaS-routed requests), goodput at the SLO and SLO attainment. Then:
- the planner's figures for each model at t = 19.5K (lambda_max, link use, the highest rate the
  link carries) and the link bandwidth at which the dense model becomes viable at 2.58 req/s
  (with t fixed at 19.5K, and with t chosen by the planner);
- the dense model's live saturation at t = 19.5K (completion rate over the steady window when
  offered 120% of the planner's rate for that setting) against the planner's figure;
- a plot of link use and TTFT p90 per model and policy (bench/reports/thesis.png) and the table
  (bench/reports/thesis.md).

Usage: python bench/thesis.py [--duration 240s] [--substrate local] [--skip-saturation]
About 8 minutes on 2 cores with the defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from testbed.metrics.records import HistoryEvent, RequestRecord
from testbed.planner import plan_deployment, plan_inputs
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.runner import run_scenario
from testbed.scenario.schema import Scenario, load_scenario
from testbed.units import parse_duration

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "thesis.yaml"
REPORTS = ROOT / "bench" / "reports"
POLICIES = ("prfaas-static", "prfaas")
PAPER_T = 19_500.0
DENSE = "minimax-m2.5"


def variant(
    base: Scenario, deployment: str, *, duration: float, rate: float | None = None
) -> Scenario:
    wl = base.workload
    arrivals = wl.arrivals if rate is None else wl.arrivals.model_copy(update={"rate": rate})
    return base.model_copy(
        update={
            "deployment": deployment,
            "duration": duration,
            "workload": wl.model_copy(update={"arrivals": arrivals}),
            "checkers": [],
        }
    )


def p90(values: list[float]) -> float | None:
    return float(np.percentile(values, 90)) if values else None


def link_use(history: list[HistoryEvent], lo: float, hi: float) -> tuple[float, float]:
    """Mean and peak Gbps of the link samples inside [lo, hi] (real-world, as the report)."""
    gbps = [e.data["gbps"] for e in history if e.kind == "link" and lo <= e.t <= hi]
    configured = [e.data["configured_gbps"] for e in history if e.kind == "link"]
    mean = float(np.mean(gbps)) if gbps else 0.0
    return mean, mean / (configured[0] if configured else 100.0)


def completion_rate(records: list[RequestRecord], lo: float, hi: float) -> float:
    ends = sorted(r.last_token for r in records if r.status == "completed" and r.last_token)
    return (bisect.bisect_right(ends, hi) - bisect.bisect_left(ends, lo)) / (hi - lo)


def run(scenario: Scenario, policy: str, substrate: str) -> tuple[Any, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        opts = RunOptions(policy=policy, out_dir=Path(tmp), progress=False, substrate=substrate)
        rp = prepare_run(scenario, opts)
        return rp, asyncio.run(run_scenario(rp, opts))


def measure(scenario: Scenario, policy: str, substrate: str) -> dict[str, Any]:
    rp, result = run(scenario, policy, substrate)
    lo, hi = scenario.duration / 6, scenario.duration
    recs: list[RequestRecord] = result.records
    steady = [r for r in recs if lo <= r.arrival <= hi]
    ttft = [r.ttft for r in steady if r.ttft is not None]
    prfaas = [r.ttft for r in steady if r.ttft is not None and r.route == "prfaas"]
    mean_gbps, use = link_use(result.history, lo, hi)
    thresholds = [e.data["threshold_tokens"] for e in result.history if e.kind == "policy"]
    s = result.summary
    return {
        "offered": rp.rate_rps,
        "link_gbps": mean_gbps,
        "link_use": use,
        "ttft_p90": p90(ttft),
        "prfaas_ttft_p90": p90(prfaas),
        "prfaas_share": len(prfaas) / len(ttft) if ttft else 0.0,
        "goodput": s["goodput_rps"],
        "slo_attainment": s["slo_attainment"],
        "failed": s["requests"]["failed"],
        "submitted": s["requests"]["submitted"],
        "t_end": thresholds[-1] if thresholds else None,
    }


def viable_bandwidth(base: Scenario, deployment: str, rate: float, t: float | None) -> float | None:
    """Smallest link (Gbps, 1 Gbps steps up to 2 Tbps) whose plan carries `rate`."""
    dep = base.deployments[deployment]
    inputs = plan_inputs(base)
    for gbps in range(1, 2001):
        plan = plan_deployment(
            deployment, dep, inputs, link_bytes_per_s=gbps * 1e9 / 8, threshold_tokens=t
        )
        if plan.lambda_max_rps >= rate:
            return float(gbps)
    return None


def fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def plot(rows: list[tuple[str, str, dict[str, Any]]], slo: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(m for m, _, _ in rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.38
    for i, policy in enumerate(POLICIES):
        cells = {m: r for m, p, r in rows if p == policy}
        xs = np.arange(len(models)) + (i - 0.5) * width
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--duration", type=parse_duration, default=240.0, help="real-world per run")
    ap.add_argument("--substrate", default="local")
    ap.add_argument("--skip-saturation", action="store_true")
    ap.add_argument("--models", help="comma-separated deployments of thesis.yaml (default: all)")
    ap.add_argument("--reports", type=Path, default=REPORTS, help="where thesis.md/.png go")
    args = ap.parse_args()
    base = load_scenario(SCENARIO)
    rate = base.workload.arrivals.rate or 0.0
    inputs = plan_inputs(base)
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
    models = args.models.split(",") if args.models else list(base.deployments)
    for name in models:
        for policy in POLICIES:
            r = measure(variant(base, name, duration=args.duration), policy, args.substrate)
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
    if len(dense) == 2:
        gain = dense["prfaas"]["goodput"] / max(dense["prfaas-static"]["goodput"], 1e-9)
        best = plan_deployment(DENSE, base.deployments[DENSE], inputs).lambda_max_rps
        table += [
            "",
            f"{DENSE}: goodput under prfaas / under prfaas-static = {gain:.2f}x; the planner's "
            f"best for it on this link, at any threshold, is {best:.2f} req/s "
            f"({rate / best:.0%} of it is offered)",
            "",
        ]
        print(table[-2], flush=True)

    if not args.skip_saturation:
        dep = base.deployments[DENSE]
        planned = plan_deployment(DENSE, dep, inputs, threshold_tokens=PAPER_T).lambda_max_rps
        sat = variant(base, DENSE, duration=args.duration, rate=1.2 * planned)
        _, result = run(sat, "prfaas-static", args.substrate)
        measured = completion_rate(result.records, args.duration / 6, args.duration)
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
    plot(rows, base.slo.ttft, args.reports / "thesis.png")
    (args.reports / "thesis.md").write_text("\n".join(lines + table) + "\n")
    print(f"wrote {args.reports / 'thesis.md'} and thesis.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
