"""`prfaas-predict` live (issue #18's live tables): the runs of bench/predict.py's sim tables that
the issue asked to see on real processes, each beside the sim's figure for the same settings.

1. bandwidth drop (library `bandwidth-drop`, 100 -> 5 Gbps for 60 s) at the offered rate of
   50% of lambda_max: P90 TTFT of the requests arriving during the drop, per policy and seed;
   the hindsight row is `prfaas-static` on the planner's split at the fixed threshold whose
   sim mean is lowest there (bench/predict.py's pinned-split grid, `testbed hindsight`'s t's).
2. jitter, link-flap, burst and mooncake-trace at 100% of lambda_max: SLO attainment and P90
   TTFT per policy and seed, and prfaas-predict's margin over the better of the two baselines.
3. cache-skew at 100%, with the triage dial's k = 30 and the local reserve as well.

Every run is the library scenario with `--set` settings (bench/predict.py's jobs), checkers
off; live is the local substrate at the scenario's time_scale, one run at a time; the sim
column is the same jobs on the sim. Seeds: each scenario's seed + 0..N-1.

Usage: python bench/predict_live.py [--only drop|dynamic|cache-skew] [--seeds 3] [--report FILE]
       [--json FILE]
About 25 minutes on 2 cores with the defaults (63 live runs of 20-25 s); run it on a quiet
machine: an emulated engine falls behind its profile when the CPU is taken. --report FILE writes
the tables into FILE's `predict-live` section (the rest of FILE is kept).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path
from typing import Any

from predict_grid import (  # bench/predict_grid.py: the script's directory is on sys.path
    SPLITS,
    Job,
    Measure,
    drop_job,
    drop_measure,
    dynamic_job,
    dynamic_measure,
    planned,
    run_jobs,
)
from provenance import markdown_section

from testbed.scenario.library import LIBRARY_DIR
from testbed.scenario.schema import load_scenario

POLICIES = ("prfaas-predict", "prfaas", "prfaas-static")
DYNAMIC = ("jitter", "link-flap", "burst", "mooncake-trace")
CACHE_SKEW: tuple[tuple[str, str, dict[str, float] | None], ...] = (
    ("prfaas-predict", "prfaas-predict", None),
    ("k = 30", "prfaas-predict", {"triage_weight": 30.0}),
    ("k = 30, reserve 0.9", "prfaas-predict", {"triage_weight": 30.0, "local_reserve": 0.9}),
    ("prfaas", "prfaas", None),
    ("prfaas-static", "prfaas-static", None),
)
"""cache-skew's rows: (label, policy, `policy.predict` knobs or None for the policy's own)."""
Rows = list[dict[str, Any]]


def _both(name: str, jobs: list[Job], measure: Measure, n_jobs: int) -> tuple[Rows, Rows]:
    """The jobs on the sim (`n_jobs` processes), then live (one at a time): rows in job order."""
    sim = run_jobs(name, jobs, measure, n_jobs)
    return sim, run_jobs(name, jobs, measure, 1, substrate="local")


def _mean(rows: Rows, key: str) -> float | None:
    vals = [r[key] for r in rows if r[key] is not None]
    return statistics.fmean(vals) if vals else None


def _s(v: float | None, spec: str = ".2f", unit: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{unit}"


def _seeds(name: str, n: int) -> list[int]:
    base = load_scenario(LIBRARY_DIR / f"{name}.yaml").seed
    return [base + i for i in range(n)]


def drop(seeds: int, n_jobs: int) -> dict[str, Any]:
    """The drop's live rows, the sim's for the same jobs, and the hindsight-best t on the
    planner's split (from the sim's pinned-split grid)."""
    rate, thresholds = planned("bandwidth-drop", 0.5)
    split = SPLITS[0]  # the planner's PD-P count at this rate (bench/predict.py's note)
    grid = [drop_job("prfaas-static", s, float(t), rate, split) for t in thresholds
            for s in range(seeds)]  # fmt: skip
    by_t: dict[float, list[float]] = {}
    for r in run_jobs("bandwidth-drop", grid, drop_measure, n_jobs):
        if r["p90_during_s"] is not None:
            by_t.setdefault(r["threshold"], []).append(r["p90_during_s"])
    best_t = min(by_t, key=lambda t: statistics.fmean(by_t[t]))
    jobs = [drop_job(p, s, None, rate) for p in POLICIES for s in range(seeds)]
    jobs += [drop_job("prfaas-static", s, best_t, rate, split) for s in range(seeds)]
    sim, live = _both("bandwidth-drop", jobs, drop_measure, n_jobs)
    return {"rate": rate, "split": split, "best_t": best_t, "sim": sim, "live": live}


def _drop_rows(rows: Rows, policy: str | None) -> Rows:
    """`policy`'s rows of the drop, or with None the hindsight row's (the fixed threshold)."""
    if policy is None:
        return [r for r in rows if r["threshold"] is not None]
    return [r for r in rows if r["policy"] == policy and r["threshold"] is None]


def render_drop(d: dict[str, Any], seeds: int) -> list[str]:
    ids = _seeds("bandwidth-drop", seeds)
    t, split = d["best_t"] / 1000, d["split"]
    hind = f"hindsight-best on the planner's split (t = {t:.1f}K, {split} PD-P)"
    out = [
        "### Bandwidth drop at 50% load, live\n",
        f"P90 TTFT of the requests arriving during the 60 s at 5 Gbps, seconds, at the offered "
        f"rate of 50% of lambda_max ({d['rate']:.4f} req/s); the sim's mean for the same "
        "settings beside it.\n",
        "| policy | " + " | ".join(f"seed {i}" for i in ids)
        + " | mean | sim mean | P90 before the drop (mean) | lost |",
        "|---|" + "---|" * (seeds + 4),
    ]  # fmt: skip
    for label in (*POLICIES, hind):
        live, sim = (_drop_rows(d[k], None if label == hind else label) for k in ("live", "sim"))
        lost = sum(r["failed"] for r in live)
        out.append(
            f"| {label} | " + " | ".join(_s(r["p90_during_s"]) for r in live)
            + f" | {_s(_mean(live, 'p90_during_s'))} | {_s(_mean(sim, 'p90_during_s'))} | "
            f"{_s(_mean(live, 'p90_before_s'))} | {lost}/{sum(r['requests'] for r in live)} |"
        )  # fmt: skip
    return [*out, ""]


def dynamic(seeds: int, n_jobs: int) -> dict[str, tuple[Rows, Rows]]:
    out = {}
    for name in DYNAMIC:
        jobs = [dynamic_job(name, p, s) for p in POLICIES for s in range(seeds)]
        out[name] = _both(name, jobs, dynamic_measure, n_jobs)
    return out


def _policy_rows(label: str, live: Rows, sim: Rows) -> str:
    att = " / ".join(f"{r['slo_attainment']:.1%}" for r in live)
    p90 = " / ".join(_s(r["p90_ttft_s"], ".1f", " s") for r in live)
    lost = f"{sum(r['failed'] for r in live)}/{sum(r['requests'] for r in live)}"
    return (
        f"| {label} | {att} | {_s(_mean(live, 'slo_attainment'), '.1%')} | {p90} | "
        f"{_s(_mean(live, 'p90_ttft_s'), '.1f', ' s')} | "
        f"{_s(_mean(sim, 'slo_attainment'), '.1%')} / {_s(_mean(sim, 'p90_ttft_s'), '.1f', ' s')}"
        f" | {lost} |"
    )


def render_dynamic(d: dict[str, tuple[Rows, Rows]], seeds: int) -> list[str]:
    out = [
        "### Dynamic scenarios at 100% of lambda_max, live\n",
        "SLO attainment and P90 TTFT per seed, their mean, and the sim's mean for the same "
        "settings; the margin is prfaas-predict's attainment minus the better of the two "
        "baselines', in points, and its P90 against the lower of theirs.\n",
    ]
    for name, (sim, live) in d.items():
        out += [
            f"**{name}** (seeds {', '.join(map(str, _seeds(name, seeds)))}):\n",
            "| policy | SLO attainment per seed | mean | P90 TTFT per seed | mean | "
            "sim: SLO / P90 (mean) | lost |",
            "|---|---|---|---|---|---|---|",
        ]
        means: dict[str, tuple[float | None, float | None]] = {}
        for p in POLICIES:
            lv, sm = [r for r in live if r["policy"] == p], [r for r in sim if r["policy"] == p]
            out.append(_policy_rows(p, lv, sm))
            means[p] = (_mean(lv, "slo_attainment"), _mean(lv, "p90_ttft_s"))
        out += ["", _verdict(means), ""]
    return out


def _verdict(means: dict[str, tuple[float | None, float | None]]) -> str:
    (att, p90), others = means["prfaas-predict"], [means["prfaas"], means["prfaas-static"]]
    best = max((a for a, _ in others if a is not None), default=None)
    low = min((q for _, q in others if q is not None), default=None)
    if att is None or p90 is None or best is None or low is None:
        return "prfaas-predict: -"
    return (
        f"prfaas-predict: {(att - best) * 100:+.1f} points against the better of the two, "
        f"P90 TTFT {p90 / low - 1:+.0%} against the lower."
    )


def cache_skew(seeds: int, n_jobs: int) -> tuple[Rows, Rows]:
    jobs = []
    for label, policy, knobs in CACHE_SKEW:
        for s in range(seeds):
            labels, settings = dynamic_job("cache-skew", policy, s, knobs)
            jobs.append(({**labels, "policy": label}, settings))
    return _both("cache-skew", jobs, dynamic_measure, n_jobs)


def render_cache_skew(d: tuple[Rows, Rows], seeds: int) -> list[str]:
    sim, live = d
    ids = ", ".join(map(str, _seeds("cache-skew", seeds)))
    out = [
        f"**cache-skew** (seeds {ids}; k = 30 is `--set policy.predict.triage_weight=30`, the "
        "reserve `--set policy.predict.local_reserve=0.9`):\n",
        "| policy | SLO attainment per seed | mean | P90 TTFT per seed | mean | "
        "sim: SLO / P90 (mean) | lost |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, _, _ in CACHE_SKEW:
        lv = [r for r in live if r["policy"] == label]
        out.append(_policy_rows(label, lv, [r for r in sim if r["policy"] == label]))
    return [*out, ""]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--only", choices=("drop", "dynamic", "cache-skew"))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2, help="processes for the sim runs")
    ap.add_argument("--report", type=Path, help="also write the tables to this markdown file")
    ap.add_argument("--json", type=Path, help="also write the raw rows as JSON")
    args = ap.parse_args()
    load_before = os.getloadavg()
    out: list[str] = []
    raw: dict[str, Any] = {}
    if args.only in (None, "drop"):
        raw["drop"] = drop(args.seeds, args.jobs)
        out += render_drop(raw["drop"], args.seeds)
    if args.only in (None, "dynamic"):
        dyn = dynamic(args.seeds, args.jobs)
        raw["dynamic"] = dyn
        out += render_dynamic(dyn, args.seeds)
    if args.only in (None, "cache-skew"):
        raw["cache-skew"] = cache_skew(args.seeds, args.jobs)
        if args.only is not None:
            out.append("### Dynamic scenarios at 100% of lambda_max, live\n")
        out += render_cache_skew(raw["cache-skew"], args.seeds)
    text = "\n".join(out)
    print(text)
    if args.report:
        setup = (
            f"local (live) at each scenario's time_scale, one run at a time, and the sim for "
            f"the same settings; seeds: each scenario's seed + 0..{args.seeds - 1}"
        )
        heading = "prfaas-predict live"
        markdown_section(args.report, "predict-live", heading, load_before, setup, text)
    if args.json:
        args.json.write_text(json.dumps(raw, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
