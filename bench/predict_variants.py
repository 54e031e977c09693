"""The alternatives docs/scheduler.md weighs against the defaults it chose, each a `--set` of
today's code on the sim (issue #37: the doc's figures written by a command, not pasted from
scratch runs). Every figure is the mean over three seeds (min-max where shown).

1. the short-term loop on the 50%-load bandwidth drop (`prfaas`): queue balance on and off
   (P90 TTFT during the drop), and how far its t moves during the drop;
2. the long-term loop's `sustain` on the drop at 90% load: 6 checks (the default), 1 (the first
   value tried) and no long-term loop (`prfaas-nolongterm`);
3. `prfaas-predict`'s triage before issue #18 (`busy_rate: current`), with and without the
   bandwidth floor (`min_bandwidth_share`), on link-flap and bandwidth-drop at 100%;
4. triage settings on the eight dynamic scenarios at 100% of lambda_max (slack, target,
   `busy_weight`, the local reserve with and without the dial), each against the better of
   `prfaas` and `prfaas-static` as bench/predict.py's dial table counts them;
5. where the requests of cache-skew's burst go (seed 17, 65-90 s in 5 s bins): the mean
   uncached tokens of those routed to PD-P and their median TTFT;
6. the saturation run's tail (steady paper workload at 120%): more values of the dial, and
   `prfaas-static` at the fixed thresholds of `testbed hindsight`'s grid around the planner's t,
   and where the requests go there (seed 1: routed, median TTFT and completed per route).

Usage: python bench/predict_variants.py [--only short|sustain|floor|triage|burst|tail]
       [--seeds 3] [--jobs 2] [--duration 600] [--report FILE]
About 6 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from predict_grid import (  # bench/predict_grid.py: the script's directory is on sys.path
    DYNAMIC,
    Job,
    baselines,
    drop_job,
    drop_measure,
    dynamic_job,
    dynamic_measure,
    dynamic_rows,
    fmt_spread,
    planner_point,
    rate_for,
    run_jobs,
    saturation_job,
    saturation_measure,
    settings_for,
    spread,
    write_report,
)

from testbed.experiment import Run, completion_rate, in_window, percentile, steady_window
from testbed.scenario.hindsight import default_thresholds

SECTIONS = ("short", "sustain", "floor", "triage", "burst", "tail")


def short_measure(run: Run) -> dict[str, Any]:
    """drop_measure, and the lowest and highest t adopted during the drop."""
    fault = next(e for e in run.scenario.nemesis if e.action == "bandwidth")
    assert fault.for_ is not None
    ts = [
        e.data["threshold_tokens"]
        for e in run.history
        if e.kind == "threshold" and fault.at <= e.t < fault.at + fault.for_
    ]
    return {**drop_measure(run), "t_min": min(ts, default=None), "t_max": max(ts, default=None)}


def short_term(n_jobs: int, seeds: int) -> list[str]:
    """`prfaas` on the 50%-load drop with and without queue balance: P90 TTFT during the drop
    and the lowest and highest t in force during it."""
    rate = rate_for("bandwidth-drop", 0.5)
    variants = {"queue balance (default)": "true", "no queue balance": "false"}

    def job(label: str, seed: int) -> Job:
        labels, settings = drop_job("prfaas", seed, None, rate)
        return {**labels, "variant": label}, (
            *settings,
            ("policy.short_term.queue_balance", variants[label]),
        )

    rows = run_jobs(
        "bandwidth-drop", [job(v, s) for v in variants for s in range(seeds)], short_measure, n_jobs
    )
    out = [
        "## The short-term loop on the drop (sim)\n",
        f"`prfaas`, bandwidth-drop at 50% of lambda_max (100 -> 5 Gbps for 60 s), {seeds} seeds: "
        "P90 TTFT of the requests arriving during the drop, and the lowest and highest "
        "threshold t adopted during it (`threshold` events).\n",
        "| variant | P90 TTFT during | t during the drop, lowest | highest |",
        "|---|---|---|---|",
    ]
    for v in variants:
        rs = [r for r in rows if r["variant"] == v]
        lo, hi = spread(rs, "t_min"), spread(rs, "t_max")
        out.append(
            f"| {v} | {fmt_spread(spread(rs, 'p90_during_s'), '.1f', ' s')} | "
            f"{_k(lo[1] if lo else None)} | {_k(hi[2] if hi else None)} |"
        )
    out.append("")
    return out


def _k(tokens: float | None) -> str:
    return "-" if tokens is None else f"{tokens / 1000:.1f}K"


def sustain_measure(run: Run) -> dict[str, Any]:
    """drop_measure, and the PD splits adopted."""
    splits = [e for e in run.history if e.kind == "split"]
    return {**drop_measure(run), "conversions": len(splits)}


def sustain(n_jobs: int, seeds: int) -> list[str]:
    """The drop at 90% load: the long-term loop with `sustain` 6 and 1, and without it."""
    rate = rate_for("bandwidth-drop", 0.9)
    variants: dict[str, tuple[str, str | None]] = {
        "prfaas, sustain 6 (default)": ("prfaas", None),
        "prfaas, sustain 1": ("prfaas", "1"),
        "prfaas-nolongterm": ("prfaas-nolongterm", None),
    }

    def job(label: str, seed: int) -> Job:
        policy, value = variants[label]
        labels, settings = drop_job(policy, seed, None, rate)
        extra = (("policy.long_term.sustain", value),) if value else ()
        return {**labels, "variant": label}, (*settings, *extra)

    rows = run_jobs(
        "bandwidth-drop",
        [job(v, s) for v in variants for s in range(seeds)],
        sustain_measure,
        n_jobs,
    )
    out = [
        "## The long-term loop's sustain on the drop at 90% (sim)\n",
        f"bandwidth-drop at 90% of lambda_max, {seeds} seeds: P90 TTFT of the requests arriving "
        "during the drop, and the PD splits adopted (`split` events) per run.\n",
        "| variant | P90 TTFT during | splits adopted |",
        "|---|---|---|",
    ]
    for v in variants:
        rs = [r for r in rows if r["variant"] == v]
        out.append(
            f"| {v} | {fmt_spread(spread(rs, 'p90_during_s'), '.1f', ' s')} | "
            f"{fmt_spread(spread(rs, 'conversions'), '.1f')} |"
        )
    out.append("")
    return out


FLOOR: dict[str, dict[str, Any]] = {
    "defaults (busy_rate: nominal)": {},
    "min_bandwidth_share: 0": {"min_bandwidth_share": 0.0},
    "busy_rate: current": {"busy_rate": "current"},
    "busy_rate: current, min_bandwidth_share: 0": {
        "busy_rate": "current",
        "min_bandwidth_share": 0.0,
    },
}
"""`policy.predict` variants of the floor table: the triage before issue #18 and the floor."""


def floor(n_jobs: int, seeds: int) -> list[str]:
    """link-flap and bandwidth-drop at 100%: SLO attainment / P90 TTFT per FLOOR variant."""
    names = ("link-flap", "bandwidth-drop")
    jobs = [dynamic_job(n, v, s, FLOOR[v]) for v in FLOOR for n in names for s in range(seeds)]
    rows: list[dict[str, Any]] = []
    for name in names:
        rows += run_jobs(
            name, [j for j in jobs if j[0]["scenario"] == name], dynamic_measure, n_jobs
        )
    out = [
        "## prfaas-predict: the triage's rate and the bandwidth floor (sim)\n",
        f"At 100% of lambda_max, {seeds} seeds; each cell SLO attainment / P90 TTFT.\n",
        "| variant | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for v in FLOOR:
        cells = [_cell([r for r in rows if r["policy"] == v and r["scenario"] == n]) for n in names]
        out.append(f"| {v} | " + " | ".join(cells) + " |")
    out.append("")
    return out


def _cell(rs: Sequence[dict[str, Any]]) -> str:
    a = statistics.fmean(r["slo_attainment"] for r in rs)
    q = statistics.fmean(r["p90_ttft_s"] for r in rs)
    return f"{a:.1%} / {q:.1f} s"


TRIAGE: dict[str, dict[str, Any]] = {
    "default": {},
    **{f"triage_slack {x:g}": {"triage_slack": x} for x in (2.0, 2.5, 3.0, 4.0)},
    **{f"ttft_target {x} s": {"ttft_target": f"{x}s"} for x in (8, 13, 16, 20)},
    **{f"k = 30, busy_weight {x:g}": {"triage_weight": 30.0, "busy_weight": x} for x in (1.0, 3.0)},
    **{
        f"k = 30, reserve {x:g}": {"triage_weight": 30.0, "local_reserve": x}
        for x in (0.8, 0.9, 1.0)
    },
    "reserve 1 (no dial)": {"local_reserve": 1.0},
}
"""`policy.predict` variants of the triage table (label -> knobs)."""


def triage(n_jobs: int, seeds: int) -> list[str]:
    """The TRIAGE variants on the eight dynamic scenarios at 100%, against the baselines."""
    jobs = [dynamic_job(n, v, s, TRIAGE[v]) for v in TRIAGE for n in DYNAMIC for s in range(seeds)]
    jobs += [dynamic_job(n, p, s) for p in ("prfaas", "prfaas-static") for n in DYNAMIC
             for s in range(seeds)]  # fmt: skip
    rows = dynamic_rows(jobs, n_jobs)
    out = [
        "## prfaas-predict: triage settings on the dynamic scenarios at 100% (sim)\n",
        f"{seeds} seeds; each cell SLO attainment / P90 TTFT; the last columns count the "
        "scenarios where attainment is at least the better of prfaas and prfaas-static's (and "
        "5+ points above it) and where P90 TTFT is no worse than the better of the two (as "
        "bench/predict.py's dial table).\n",
        "| variant | " + " | ".join(DYNAMIC) + " | SLO >= | 5+ above | P90 no worse |",
        "|---|" + "---|" * (len(DYNAMIC) + 3),
    ]
    for v in [*TRIAGE, "prfaas", "prfaas-static"]:
        cells, geq, five, p90 = [], 0, 0, 0
        for name in DYNAMIC:
            rs = [r for r in rows if r["policy"] == v and r["scenario"] == name]
            cells.append(_cell(rs))
            ref_slo, ref_p90 = baselines(rows, name)
            a = statistics.fmean(r["slo_attainment"] for r in rs)
            geq += a >= ref_slo
            five += a >= ref_slo + 0.05
            p90 += statistics.fmean(r["p90_ttft_s"] for r in rs) <= ref_p90
        n = len(DYNAMIC)
        out.append(f"| {v} | " + " | ".join(cells) + f" | {geq}/{n} | {five}/{n} | {p90}/{n} |")
    out.append("")
    return out


BURST: dict[str, tuple[str, dict[str, Any] | None]] = {
    "prfaas-predict, k = 30": ("prfaas-predict", {"triage_weight": 30.0}),
    "prfaas-predict, k = 30, reserve 0.9": (
        "prfaas-predict",
        {"triage_weight": 30.0, "local_reserve": 0.9},
    ),
    "prfaas-predict (default)": ("prfaas-predict", {}),
    "prfaas": ("prfaas", None),
}
"""Policies whose routing through cache-skew's burst the burst table shows."""
BINS = (65.0, 90.0, 5.0)
"""cache-skew's burst window and its bins (s): the burst's arrivals and what follows."""


def burst_measure(run: Run) -> dict[str, Any]:
    """Per bin of BINS: the mean uncached tokens of the requests routed to PD-P, their median
    TTFT."""
    lo, hi, step = BINS
    edges = [lo + i * step for i in range(round((hi - lo) / step))]
    tokens, ttfts = [], []
    for a in edges:
        local = [r for r in in_window(run.records, a, a + step) if r.route == "local"]
        tokens.append(
            statistics.fmean(r.input_tokens - r.cached_tokens for r in local) if local else None
        )
        ttfts.append(percentile([r.ttft for r in local if r.ttft is not None], 50.0))
    return {"tokens": tokens, "ttfts": ttfts}


def burst(n_jobs: int) -> list[str]:
    """cache-skew at 100%, its own seed: per 5 s bin of arrivals, the mean uncached tokens of
    the requests routed to PD-P and their median TTFT."""
    lo, hi, step = BINS
    jobs = [dynamic_job("cache-skew", v, 0, knobs) for v, (_, knobs) in BURST.items()]
    jobs = [({**lab, "variant": v}, st) for (lab, st), v in zip(jobs, BURST, strict=True)]
    rows = run_jobs("cache-skew", jobs, burst_measure, n_jobs)
    out = [
        "## cache-skew's burst: what PD-P is given (sim)\n",
        f"cache-skew at 100% of lambda_max, its seed; requests arriving {lo:g}-{hi:g} s in "
        f"{step:g} s bins: the range over the bins of the mean uncached input tokens of the "
        "requests routed to PD-P, and of their median TTFT.\n",
        "| policy | uncached tokens on PD-P, per bin | median TTFT on PD-P, per bin |",
        "|---|---|---|",
    ]
    for row in rows:
        tk = [x for x in row["tokens"] if x is not None]
        tt = [x for x in row["ttfts"] if x is not None]
        out.append(
            f"| {row['variant']} | {min(tk) / 1000:.1f}-{max(tk) / 1000:.1f}K | "
            f"{min(tt):.1f}-{max(tt):.1f} s |"
        )
    out.append("")
    return out


def tail(n_jobs: int, seeds: int, duration: float) -> list[str]:
    """The steady paper workload at 120%: saturation throughput and the run's P90 TTFT for more
    values of the dial and for `prfaas-static` at the other fixed thresholds of `testbed
    hindsight`'s grid within a factor 2 of the planner's t (at the offered rate the planner's t
    sets)."""
    dial = {
        f"prfaas-predict, k = {k:g}": {"triage_weight": k}
        for k in (30.0, 60.0, 100.0, 140.0, 300.0)
    }
    jobs = [
        saturation_job(v, s, duration, knobs) for v, knobs in dial.items() for s in range(seeds)
    ]
    jobs += [saturation_job(p, s, duration) for p in ("prfaas-predict", "prfaas-static")
             for s in range(seeds)]  # fmt: skip
    rate, planner_t = planner_point("paper", 1.2)
    # the grid's points within 2x of t, t itself aside: that run is the prfaas-static row's
    fixed = [
        t for t in default_thresholds(planner_t)
        if 0.49 <= t / planner_t <= 2.01 and t != round(planner_t)
    ]  # fmt: skip
    for t in fixed:
        for s in range(seeds):
            labels = {"policy": f"prfaas-static, t = {t / planner_t:.2f} x planner's", "seed": s}
            settings = settings_for(
                "paper", policy="prfaas-static", seed_offset=s, threshold=t, duration=duration,
                arrivals={"load": None, "rate": rate, "process": "uniform"},
            )  # fmt: skip
            jobs.append((labels, settings))
    rows = run_jobs("paper", jobs, _tail_measure, n_jobs)
    static = statistics.fmean(r["rate_rps"] for r in rows if r["policy"] == "prfaas-static")
    static_p90 = statistics.fmean(r["p90_ttft_s"] for r in rows if r["policy"] == "prfaas-static")
    out = [
        "## The saturation run's tail (sim)\n",
        f"Steady paper workload, uniform arrivals at 120% of lambda_max, {duration:.0f} s, "
        f"{seeds} seeds: completion rate over the last five sixths and P90 TTFT of every "
        "request of the run, against `prfaas-static` at the planner's t.\n",
        "| policy | saturation req/s | vs prfaas-static | P90 TTFT | vs prfaas-static |",
        "|---|---|---|---|---|",
    ]
    labels_seen = list(dict.fromkeys(r["policy"] for r in rows))
    for v in labels_seen:
        rs = [r for r in rows if r["policy"] == v]
        m, q = spread(rs, "rate_rps"), spread(rs, "p90_ttft_s")
        assert m is not None and q is not None
        out.append(
            f"| {v} | {fmt_spread(m, '.2f')} | {m[0] / static - 1:+.1%} | "
            f"{fmt_spread(q, '.1f', ' s')} | {q[0] / static_p90 - 1:+.1%} |"
        )
    out += [
        "",
        "Where the requests go (the first seed): requests routed to each cluster, their median "
        "TTFT, their mean input tokens, and how many completed in the steady window.\n",
        "| policy | route | routed | median TTFT | mean input tokens | completed in the window |",
        "|---|---|---|---|---|---|",
    ]
    for v in ("prfaas-predict", "prfaas-predict, k = 30"):
        row = next(r for r in rows if r["policy"] == v and r["seed"] == 0)
        for route, (n, med, tokens, done) in row["routes"].items():
            out.append(f"| {v} | {route} | {n} | {med:.1f} s | {tokens / 1000:.1f}K | {done} |")
    out.append("")
    return out


def _tail_measure(run: Run) -> dict[str, Any]:
    """The saturation measure, and per route: routed, median TTFT, mean input tokens and the
    completions in the steady window."""
    lo, hi = steady_window(run.duration_s)
    routes: dict[str, tuple[int, float, float, int]] = {}
    for route in ("local", "prfaas"):
        rs = [r for r in run.records if r.route == route]
        med = percentile([r.ttft for r in rs if r.ttft is not None], 50.0)
        done = round(completion_rate(rs, lo, hi) * (hi - lo))
        routes[route] = (len(rs), med or 0.0, statistics.fmean(r.input_tokens for r in rs), done)
    return {**saturation_measure(run), "routes": routes}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--only", choices=SECTIONS)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--duration", type=float, default=600.0, help="saturation run, real-world s")
    ap.add_argument("--report", type=Path, help="also write the tables to this markdown file")
    args = ap.parse_args()
    load_before = os.getloadavg()
    out = [f"# prfaas' and prfaas-predict's alternatives on the sim ({args.seeds} seeds)\n"]
    runs = {
        "short": lambda: short_term(args.jobs, args.seeds),
        "sustain": lambda: sustain(args.jobs, args.seeds),
        "floor": lambda: floor(args.jobs, args.seeds),
        "triage": lambda: triage(args.jobs, args.seeds),
        "burst": lambda: burst(args.jobs),
        "tail": lambda: tail(args.jobs, args.seeds, args.duration),
    }
    for name in SECTIONS:
        if args.only in (None, name):
            part = runs[name]()
            print("\n".join(part), flush=True)
            out += part
    if args.report:
        write_report(
            args.report, "bench/predict_variants.py", load_before, args.seeds, args.jobs, out
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
