"""`prfaas-predict` against `prfaas`, `prfaas-static` and the best fixed threshold in hindsight
(issue #18), on the sim substrate; every figure is the mean over three seeds (min-max shown).

1. bandwidth drop (library `bandwidth-drop`, 100 -> 5 Gbps for 60 s) at 50% of lambda_max:
   P90 TTFT of the requests arriving during the drop, per policy; the hindsight row is
   `prfaas-static` at the fixed threshold (from a grid) whose mean over the seeds is lowest.
   With the PD split pinned (3 = the planner's, 4, 5 PD-P), each policy against the best
   fixed threshold on the same split (`--only split`): a fixed t left to the planner also gets
   the planner's split for that t.
2. the dynamic scenarios of the library (burst, diurnal, link-flap, jitter, bandwidth-drop,
   traffic-shift, cache-skew, mooncake-trace) with `workload.arrivals.load` set to 1.0 (100%
   of the planner's lambda_max; for diurnal that is its base load, its peaks stack on top):
   SLO attainment (TTFT and TPOT within the SLO) and P90 TTFT per policy.
   Then the triage dial (`policy.predict.triage_weight`) on the same scenarios, and every fixed
   threshold of `testbed hindsight`'s grid on them (which reach the baselines' P90 with more
   SLO attainment).
3. saturation on the steady paper workload (bench/fidelity.py's method: uniform arrivals at
   120% of lambda_max, 600 s real-world, completion rate over the last five sixths).
4. ablations: each `policy.predict` knob against the defaults (the drop, link-flap at 100%),
   and the long-term loop's `predrain` on traffic-shift (when the new split is in force).

Usage: python bench/predict.py [--only drop|split|yardstick|dynamic|saturation|ablation|cost]
       [--seeds 3] [--jobs 2] [--report FILE] [--json FILE]
About 2 1/2 minutes on 2 cores (each sim run takes 0.3-5 s).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path
from typing import Any

import numpy as np
from predict_grid import (  # bench/predict_grid.py: the script's directory is on sys.path
    DYNAMIC,
    POLICIES,
    SPLITS,
    baselines,
    drop_job,
    drop_measure,
    dynamic_job,
    dynamic_measure,
    dynamic_rows,
    fmt_spread,
    planned,
    rate_for,
    run_jobs,
    saturation_job,
    saturation_measure,
    shift_job,
    shift_measure,
    spread,
    write_report,
)
from predict_hindsight import dynamic_hindsight, yardstick  # bench/predict_hindsight.py

ABLATIONS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "count_queued_kv: false": {"count_queued_kv": False},
    "min_bandwidth_share: 0": {"min_bandwidth_share": 0.0},
    "busy_weight: 0.5": {"busy_weight": 0.5},
    "ttft_target: null": {"ttft_target": None},
    "triage_slack: 1.5": {"triage_slack": 1.5},
    "busy_rate: current": {"busy_rate": "current"},
}
"""`policy.predict` variants the ablation table compares with the defaults."""


def run_ablation(n_jobs: int, seeds: int) -> list[str]:
    """Each variant on the 50%-load drop (P90 during) and link-flap at 100% (SLO attainment)."""
    rate = rate_for("bandwidth-drop", 0.5)
    drop = run_jobs("bandwidth-drop", [
        drop_job(lab, s, None, rate, knobs=ABLATIONS[lab]) for lab in ABLATIONS
        for s in range(seeds)], drop_measure, n_jobs)  # fmt: skip
    flap = run_jobs("link-flap", [
        dynamic_job("link-flap", lab, s, knobs=ABLATIONS[lab]) for lab in ABLATIONS
        for s in range(seeds)], dynamic_measure, n_jobs)  # fmt: skip
    rows = [{"label": r["policy"], "case": "drop", "value": r["p90_during_s"]} for r in drop]
    rows += [{"label": r["policy"], "case": "flap", "value": r["slo_attainment"]} for r in flap]
    out = [
        "## prfaas-predict knobs (sim)\n",
        f"Each `policy.predict` variant against the defaults, mean over {seeds} seeds: P90 TTFT "
        "during the 50%-load bandwidth drop, SLO attainment on link-flap at 100% of "
        "lambda_max.\n",
        "| variant | drop: P90 TTFT during | link-flap: SLO attainment |",
        "|---|---|---|",
    ]
    for lab in ABLATIONS:
        d = spread([r for r in rows if r["label"] == lab and r["case"] == "drop"], "value")
        f = spread([r for r in rows if r["label"] == lab and r["case"] == "flap"], "value")
        assert d is not None and f is not None
        out.append(f"| {lab} | {fmt_spread(d, '.1f', ' s')} | {f[0]:.1%} ({f[1]:.1%}-{f[2]:.1%}) |")
    shift_jobs = [shift_job(p, s) for p in (3, 0) for s in range(seeds)]
    shift = run_jobs("traffic-shift", shift_jobs, shift_measure, n_jobs)
    out += [
        "",
        "traffic-shift (80% load) with prfaas-predict, long-term loop draining ahead or not:\n",
        "| predrain | new split in force at | longest drain | completed req/s in the window |",
        "|---|---|---|---|",
    ]
    for p in (3, 0):
        rs = [r for r in shift if r["predrain"] == p]
        out.append(
            f"| {p} | {fmt_spread(spread(rs, 'split_at'), '.0f', ' s')} | "
            f"{fmt_spread(spread(rs, 'max_drain_s'), '.1f', ' s')} | "
            f"{fmt_spread(spread(rs, 'rate_rps'), '.2f')} |"
        )
    out.append("")
    return out


def decision_cost(n: int = 10_000, decisions: int = 20_000) -> list[str]:
    """p50/p99 of one `decide` on a load book of `n` instances (a quarter PrfaaS prefill, a
    quarter PD-P, half PD-D) with cost curves and a link view, charging each route as the
    router does and releasing the oldest so the load stays put."""
    import time

    from testbed.policy import make_policy
    from testbed.policy.base import CostModel, LinkView, RequestView
    from testbed.policy.book import BookEntry, LoadBook
    from testbed.profiles import MODELS
    from testbed.workload.lengths import TruncatedLognormal

    model = MODELS["internal-1t-hybrid"]
    costs = CostModel.of(model, {"prfaas": "h200x8", "local": "h20x8"})
    q = n // 4
    entries = [BookEntry(f"p{i}", "prfaas", "prefill") for i in range(q)]
    entries += [BookEntry(f"l{i}", "local", "prefill") for i in range(q)]
    entries += [BookEntry(f"d{i}", "local", "decode") for i in range(n - 2 * q)]
    book = LoadBook(entries, set(), costs)
    rng = np.random.default_rng(0)
    lengths = TruncatedLognormal(9.9, 1.0, 128, 128_000).sample(rng, decisions).astype(int)
    link = LinkView(100e9 / 8, 2e9, 90e9 / 8, 0.02, False)
    out = ["## Decision cost\n", f"One `decide` on a load book of {n:,} instances (sim and "
           "router keep one), charging each route and releasing the one 1,000 routes back.\n",
           "| policy | p50 | p99 |", "|---|---|---|"]  # fmt: skip
    for name in ("prfaas-predict", "prfaas-static"):
        policy = make_policy(name)
        charged: list[tuple[str, float, str]] = []
        times = []
        for i in range(decisions):
            req = RequestView(f"r{i}", int(lengths[i]), 1024, 0, 0, costs.kv_bytes(lengths[i]))
            snap = book.snapshot(i * 0.01, 19_400.0, False, link)
            t0 = time.perf_counter()
            route = policy.decide(req, snap)
            times.append(time.perf_counter() - t0)
            book.charge(route.prefill_instance, route.uncached_tokens, route.decode_instance,
                        1024, +1)  # fmt: skip
            charged.append((route.prefill_instance, route.uncached_tokens, route.decode_instance))
            if len(charged) > 1000:
                p, tok, d = charged.pop(0)
                book.charge(p, tok, d, 1024, -1)
        qs = statistics.quantiles(times, n=100)
        out.append(f"| {name} | {qs[49] * 1e6:.0f} us | {qs[98] * 1e6:.0f} us |")
    out.append("")
    return out


def run_drop(n_jobs: int, seeds: int) -> dict[str, Any]:
    rate, thresholds = planned("bandwidth-drop", 0.5)
    jobs = [drop_job(p, s, None, rate) for p in POLICIES for s in range(seeds)]
    jobs += [drop_job("prfaas-static", s, float(t), rate) for t in thresholds
             for s in range(seeds)]  # fmt: skip
    rows = run_jobs("bandwidth-drop", jobs, drop_measure, n_jobs)
    by_t: dict[float, list[dict[str, Any]]] = {}
    for r in rows:
        if r["threshold"] is not None:
            by_t.setdefault(r["threshold"], []).append(r)
    means = {t: spread(rs, "p90_during_s") for t, rs in by_t.items()}
    best_t = min((t for t in means if means[t] is not None), key=lambda t: means[t][0])  # type: ignore[index]
    table = {p: [r for r in rows if r["policy"] == p and r["threshold"] is None] for p in POLICIES}
    table[f"hindsight (prfaas-static, t={best_t:,.0f})"] = by_t[best_t]
    return {"rows": rows, "table": table, "best_t": best_t, "grid": means}


def render_drop(d: dict[str, Any], seeds: int) -> list[str]:
    out = [
        "## Bandwidth drop at 50% of lambda_max (sim)\n",
        f"100 -> 5 Gbps for 60 s; P90 TTFT of requests arriving in the 60 s before / during the "
        f"drop, mean over {seeds} seeds (min-max).\n",
        "| policy | P90 TTFT before | P90 TTFT during | vs hindsight-best | failed |",
        "|---|---|---|---|---|",
    ]
    hind = next(v for k, v in d["table"].items() if k.startswith("hindsight"))
    ref = spread(hind, "p90_during_s")
    for name, rows in d["table"].items():
        during = spread(rows, "p90_during_s")
        rel = f"{during[0] / ref[0] - 1:+.1%}" if during and ref else "-"
        failed = sum(r["failed"] for r in rows)
        total = sum(r["requests"] for r in rows)
        out.append(
            f"| {name} | {fmt_spread(spread(rows, 'p90_before_s'), '.1f', ' s')} | "
            f"{fmt_spread(during, '.1f', ' s')} | {rel} | {failed}/{total} |"
        )
    grid = ", ".join(
        f"{t / 1000:.1f}K: {m[0]:.1f}" for t, m in sorted(d["grid"].items()) if m is not None
    )
    out += ["", f"Hindsight grid (fixed t: mean P90 during, s): {grid}.", ""]
    return out


def run_split(n_jobs: int, seeds: int) -> list[dict[str, Any]]:
    """The drop with the PD split pinned: each policy and each fixed threshold on the same
    deployment shape, so the hindsight-best threshold is compared like for like (a fixed t
    left to the planner also gets the planner's split for that t: t = 40K plans 5 PD-P)."""
    rate, thresholds = planned("bandwidth-drop", 0.5)
    pols = ("prfaas-predict", "prfaas", "prfaas-static")
    jobs = [drop_job(p, s, None, rate, n) for n in SPLITS for p in pols for s in range(seeds)]
    jobs += [drop_job("prfaas-static", s, float(t), rate, n) for n in SPLITS
             for t in thresholds for s in range(seeds)]  # fmt: skip
    return run_jobs("bandwidth-drop", jobs, drop_measure, n_jobs)


def render_split(rows: list[dict[str, Any]], seeds: int) -> list[str]:
    out = [
        "## Bandwidth drop at 50% of lambda_max, PD split pinned (sim)\n",
        "The drop of the table above with the local cluster's PD-P count fixed (of 8; the "
        "planner's split is 3 PD-P / 5 PD-D). Hindsight-best: `prfaas-static` at the fixed "
        f"threshold of the grid above whose mean over {seeds} seeds is lowest, on the same "
        "split. P90 TTFT during the drop, mean (min-max).\n",
        "| PD-P / PD-D | hindsight-best (t) | prfaas-predict | vs hindsight-best | prfaas | "
        "prfaas-static |",
        "|---|---|---|---|---|---|",
    ]
    for n in SPLITS:
        at = [r for r in rows if r["prefill"] == n]
        grid = {
            t: spread([r for r in at if r["threshold"] == t], "p90_during_s")
            for t in sorted({r["threshold"] for r in at if r["threshold"] is not None})
        }
        best_t = min((t for t in grid if grid[t] is not None), key=lambda t: grid[t][0])  # type: ignore[index]
        best = grid[best_t]
        untuned = [r for r in at if r["threshold"] is None]
        pol = {
            p: spread([r for r in untuned if r["policy"] == p], "p90_during_s")
            for p in ("prfaas-predict", "prfaas", "prfaas-static")
        }
        pred = pol["prfaas-predict"]
        rel = f"{pred[0] / best[0] - 1:+.1%}" if pred and best else "-"
        out.append(
            f"| {n} / {8 - n} | t = {best_t / 1000:.1f}K: {fmt_spread(best, '.1f', ' s')} | "
            f"{fmt_spread(pred, '.1f', ' s')} | {rel} | {fmt_spread(pol['prfaas'], '.1f', ' s')} | "
            f"{fmt_spread(pol['prfaas-static'], '.1f', ' s')} |"
        )
    out.append("")
    return out


def run_dynamic(n_jobs: int, seeds: int) -> list[dict[str, Any]]:
    jobs = [dynamic_job(n, p, s) for n in DYNAMIC for p in POLICIES for s in range(seeds)]
    return dynamic_rows(jobs, n_jobs)


def render_dynamic(rows: list[dict[str, Any]], seeds: int) -> list[str]:
    out = [
        "## Dynamic scenarios at 100% of lambda_max (sim)\n",
        f"SLO attainment (share of requests within the TTFT and TPOT SLOs) and P90 TTFT, mean "
        f'over {seeds} seeds; "margin" is prfaas-predict\'s attainment minus the better of '
        "prfaas and prfaas-static, in points.\n",
        "| scenario | "
        + " | ".join(f"{p}: SLO / P90" for p in POLICIES)
        + " | SLO margin | P90 vs best of the two |",
        "|---|" + "---|" * (len(POLICIES) + 2),
    ]
    wins = 0
    for name in DYNAMIC:
        cells, att, p90 = [], {}, {}
        for p in POLICIES:
            rs = [r for r in rows if r["scenario"] == name and r["policy"] == p]
            a, q = spread(rs, "slo_attainment"), spread(rs, "p90_ttft_s")
            att[p] = a[0] if a else float("nan")
            p90[p] = q[0] if q else float("nan")
            cells.append(f"{a[0]:.1%} / {q[0]:.1f} s" if a and q else "-")
        margin = (att["prfaas-predict"] - max(att["prfaas"], att["prfaas-static"])) * 100
        wins += margin >= 5
        ref = min(p90["prfaas"], p90["prfaas-static"])
        out.append(
            f"| {name} | "
            + " | ".join(cells)
            + f" | {margin:+.1f} | {p90['prfaas-predict'] / ref - 1:+.1%} |"
        )
    out += ["", f"prfaas-predict is 5+ points above the better of the two on {wins} of "
            f"{len(DYNAMIC)}.", ""]  # fmt: skip
    return out


DIAL: tuple[tuple[str, dict[str, float]], ...] = (
    *((f"k = {k:g}", {"triage_weight": k}) for k in (3.0, 10.0, 30.0, 60.0, 150.0)),
    ("k = 30, reserve 0.9", {"triage_weight": 30.0, "local_reserve": 0.9}),
    ("default", {}),
)
"""Columns of the dial: (label, `policy.predict` knobs); "default" is the dynamic table's
prfaas-predict (the smaller share outright, no reserve)."""


def run_dial(
    n_jobs: int,
    seeds: int,
    rows: list[dict[str, Any]],
    saturation: list[dict[str, Any]],
    duration: float,
) -> list[str]:
    """prfaas-predict with each column of DIAL on the dynamic scenarios at 100%:
    SLO attainment and P90 TTFT against the better of prfaas and prfaas-static (from `rows`,
    the dynamic table's runs), on how many scenarios each target holds, and the saturation
    throughput each k leaves (the steady paper workload at 120%; the default's and
    prfaas-static's come from `saturation`, the saturation table's runs)."""
    labels = [label for label, _ in DIAL]
    ks = [label for label, knobs in DIAL if knobs]
    dial_knobs = dict(DIAL)
    dial_jobs = [
        dynamic_job(n, k, s, dial_knobs[k]) for k in ks for n in DYNAMIC for s in range(seeds)
    ]
    dial = [{**r, "column": r["policy"]} for r in dynamic_rows(dial_jobs, n_jobs)]
    dial += [{**r, "column": "default"} for r in rows if r["policy"] == "prfaas-predict"]
    sat_jobs = [saturation_job(k, s, duration, dial_knobs[k]) for k in ks for s in range(seeds)]
    sat = [
        {**r, "column": r["policy"]}
        for r in run_jobs("paper", sat_jobs, saturation_measure, n_jobs)
    ]
    sat += [{**r, "column": "default"} for r in saturation if r["policy"] == "prfaas-predict"]
    static_rows = [r for r in saturation if r["policy"] == "prfaas-static"]
    static = statistics.fmean(r["rate_rps"] for r in static_rows)
    static_p90 = statistics.fmean(r["p90_ttft_s"] for r in static_rows)

    def mean(rs: list[dict[str, Any]], key: str) -> float:
        return statistics.fmean(r[key] for r in rs)

    def sat_row(title: str, key: str, ref: float, spec: str, unit: str) -> str:
        """A row of the saturation runs' `key` per column, against prfaas-static's `ref`."""
        ms = (mean([r for r in sat if r["column"] == k], key) for k in labels)
        cells = (f"{m:{spec}}{unit} ({m / ref - 1:+.1%})" for m in ms)
        return f"| {title} (vs prfaas-static) | " + " | ".join(cells) + " |"

    out = [
        "## The triage dial: SLO attainment against P90 TTFT (sim)\n",
        "prfaas-predict with `policy.predict.triage_weight` k (a late request goes where its "
        "predicted first token plus k x its busy share is least, while the link is not "
        "narrowed below half its nominal rate; the default, none, sends it where the share is "
        "smaller; with `local_reserve` 0.9, a request longer than 0.9 t does not take PD-P "
        "while PrfaaS is late), dynamic scenarios at 100% of lambda_max, mean over "
        f"{seeds} seeds. Each cell: SLO attainment / P90 TTFT; the last rows count the "
        "scenarios where attainment is at least the better of prfaas and prfaas-static's (and "
        "5+ points above it) and where P90 TTFT is no worse than the better of the two; the "
        "last two, the saturation throughput of the steady paper workload at 120% (as the "
        "saturation table below) and that run's P90 TTFT, against prfaas-static's.\n",
        "| scenario | " + " | ".join(labels) + " |",
        "|---|" + "---|" * len(labels),
    ]
    geq = dict.fromkeys(labels, 0)
    five = dict.fromkeys(labels, 0)
    p90_ok = dict.fromkeys(labels, 0)
    for name in DYNAMIC:
        ref_slo, ref_p90 = baselines(rows, name)
        cells = []
        for k in labels:
            rs = [r for r in dial if r["scenario"] == name and r["column"] == k]
            a, q = mean(rs, "slo_attainment"), mean(rs, "p90_ttft_s")
            geq[k] += a >= ref_slo
            five[k] += a >= ref_slo + 0.05
            p90_ok[k] += q <= ref_p90
            cells.append(f"{a:.1%} / {q:.1f} s")
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    n = len(DYNAMIC)
    out += [
        "| SLO >= better baseline | " + " | ".join(f"{geq[k]}/{n}" for k in labels) + " |",
        "| SLO 5+ points above | " + " | ".join(f"{five[k]}/{n}" for k in labels) + " |",
        "| P90 no worse | " + " | ".join(f"{p90_ok[k]}/{n}" for k in labels) + " |",
        sat_row("saturation req/s", "rate_rps", static, ".2f", ""),
        sat_row("saturation P90 TTFT", "p90_ttft_s", static_p90, ".1f", " s"),
        "",
    ]
    return out


def run_saturation(n_jobs: int, seeds: int, duration: float) -> list[dict[str, Any]]:
    jobs = [saturation_job(p, s, duration) for p in POLICIES for s in range(seeds)]
    return run_jobs("paper", jobs, saturation_measure, n_jobs)


def render_saturation(rows: list[dict[str, Any]], seeds: int, duration: float) -> list[str]:
    planner = rows[0]["planner_rps"]
    static = spread([r for r in rows if r["policy"] == "prfaas-static"], "rate_rps")
    out = [
        "## Saturation, steady paper workload (sim)\n",
        f"Uniform arrivals at 120% of lambda_max ({planner:.2f} req/s), {duration:.0f} s; "
        f"completion rate over the last five sixths, mean over {seeds} seeds; P90 TTFT of "
        "every request of the run (the sim serves the backlog out after the arrivals end), "
        "what the throughput costs the tail.\n",
        "| policy | saturation req/s | vs planner | vs prfaas-static | P90 TTFT |",
        "|---|---|---|---|---|",
    ]
    for p in POLICIES:
        rs = [r for r in rows if r["policy"] == p]
        m, q = spread(rs, "rate_rps"), spread(rs, "p90_ttft_s")
        assert m is not None and static is not None
        out.append(f"| {p} | {fmt_spread(m, '.2f')} | {m[0] / planner - 1:+.1%} | "
                   f"{m[0] / static[0] - 1:+.1%} | {fmt_spread(q, '.1f', ' s')} |")  # fmt: skip
    out.append("")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--only",
        choices=("drop", "split", "yardstick", "dynamic", "saturation", "ablation", "cost"),
    )
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--duration", type=float, default=600.0, help="saturation run, real-world s")
    ap.add_argument("--report", type=Path, help="also write the tables to this markdown file")
    ap.add_argument("--json", type=Path, help="also write the raw rows as JSON")
    args = ap.parse_args()
    load_before = os.getloadavg()
    out = [f"# prfaas-predict on the sim (`python bench/predict.py`, {args.seeds} seeds)\n"]
    raw: dict[str, Any] = {}
    if args.only in (None, "drop"):
        d = run_drop(args.jobs, args.seeds)
        raw["drop"] = d["rows"]
        out += render_drop(d, args.seeds)
        print("\n".join(out), flush=True)
    if args.only in (None, "split"):
        rows = run_split(args.jobs, args.seeds)
        raw["split"] = rows
        out += render_split(rows, args.seeds)
        print("\n".join(out[-6:]), flush=True)
    if args.only in (None, "yardstick"):
        out += yardstick(args.seeds, args.jobs)
    saturation: list[dict[str, Any]] = []
    if args.only in (None, "dynamic", "saturation"):
        # the saturation table's runs; the dial reuses its default and prfaas-static rows
        saturation = run_saturation(args.jobs, args.seeds, args.duration)
    if args.only in (None, "dynamic"):
        rows = run_dynamic(args.jobs, args.seeds)
        raw["dynamic"] = rows
        out += render_dynamic(rows, args.seeds)
        out += run_dial(args.jobs, args.seeds, rows, saturation, args.duration)
        out += dynamic_hindsight(args.seeds, args.jobs, rows)
    if args.only in (None, "cost"):
        out += decision_cost()
    if args.only in (None, "ablation"):
        out += run_ablation(args.jobs, args.seeds)
    if args.only in (None, "saturation"):
        raw["saturation"] = saturation
        out += render_saturation(saturation, args.seeds, args.duration)
    text = "\n".join(out)
    print(text)
    if args.report:
        write_report(args.report, "bench/predict.py", load_before, args.seeds, args.jobs, out)
    if args.json:
        args.json.write_text(json.dumps(raw, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
