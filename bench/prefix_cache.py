"""Prefix hits on the Mooncake trace: cache-aware (`prfaas`) vs cache-blind (`prfaas-nocache`).

Replays the first N requests (default: all 3,993) of
../shared/traces/mooncake_synthetic_trace.jsonl (Mooncake FAST'25 synthetic trace; multi-turn
conversations share prompt prefixes through their hash ids) live on the local substrate with
scenarios/mooncake-trace.yaml (the paper's 4 PrfaaS + 8 PD
deployment, 100 Gbps, trace clock rescaled to 60% of the planner's lambda_max), once per policy
with the same requests, and prints: requests, completed, cross-datacenter bytes (PrfaaS KV to
PD-D plus prefix pulls), mean and p90 TTFT, prefix-cache hit tokens per prefill cluster, pulls,
and the reductions cache-aware routing buys. Everything in real-world units.

Both policies reuse the prefix cache of the cluster a request lands in; only the routing
differs (see docs/scheduler.md, "Prefix cache").

Usage: python bench/prefix_cache.py [--requests 3993] [--time-scale 10] [--trace PATH]
                                    [--report FILE]
Takes about 8 minutes on 2 cores with the defaults (the whole trace); --requests 1000 about 3.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from provenance import reported  # bench/: the script's directory is on sys.path

from testbed.experiment import Grid, headline
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.runner import run_scenario

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"
POLICIES = ("prfaas", "prfaas-nocache")


def run_policy(policy: str, args: argparse.Namespace) -> dict[str, Any]:
    base = Grid.of(
        ROOT / "scenarios" / "mooncake-trace.yaml",
        fixed={
            "workload.trace": str(args.trace),
            "workload.max_requests": args.requests,
            "scale.time_scale": args.time_scale,
            "checkers": [],
        },
    )
    # the request cap ends the replay; the window is set from the last arrival
    probe_scenario = base.with_fixed({"duration": "1000000s"}).scenario_of()
    probe = prepare_run(probe_scenario, RunOptions(policy=policy, progress=False))
    window = math.floor(probe.requests[-1].arrival) + 1.0
    scenario = base.with_fixed({"duration": f"{window:g}s"}).scenario_of()
    with tempfile.TemporaryDirectory() as tmp:
        opts = RunOptions(policy=policy, out_dir=Path(tmp), progress=False, drain_timeout_s=180)
        rp = prepare_run(scenario, opts)
        wall = time.monotonic()
        result = asyncio.run(run_scenario(rp, opts))
        wall = time.monotonic() - wall
    s = result.summary
    cache = s["prefix_cache"]
    return {
        **headline(s),
        "cross_dc_gb": s["cross_dc_bytes"]["total"] / 1e9,
        "kv_gb": s["cross_dc_bytes"]["kv"] / 1e9,
        "pull_gb": s["cross_dc_bytes"]["pulls"] / 1e9,
        "ttft_mean": s["ttft_s"]["mean"],
        "hit_prfaas": cache["clusters"]["prfaas"]["hit_tokens"],
        "hit_local": cache["clusters"]["local"]["hit_tokens"],
        "input_tokens": s["tokens"]["input"],
        "pulls": cache["pulls"],
        "routes": s["routes"],
        "rate": rp.rate_rps,
        "window": window,
        "timing_error": s["engine"].get("max_timing_error"),
        "wall_s": wall,
    }


def reduction(aware: float | None, blind: float | None) -> str:
    if aware is None or blind is None or blind == 0:
        return "-"
    return f"{(1 - aware / blind) * 100:+.1f}%"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=3993, help="first N requests of the trace")
    ap.add_argument("--time-scale", type=float, default=10.0)
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--report", type=Path, metavar="FILE", help="also write the table here")
    args = ap.parse_args()
    if not args.trace.exists():
        print(f"trace not found: {args.trace}", file=sys.stderr)
        return 2
    setup = (
        f"local (live), time_scale {args.time_scale:g}; scenarios/mooncake-trace.yaml with "
        f"{args.trace.name}'s first {args.requests} requests (a trace: no seed changes them)"
    )
    heading = "Prefix cache: cache-aware vs cache-blind on the Mooncake trace"
    reported(args.report, "prefix_cache", heading, setup, lambda: measure(args))
    return 0


def measure(args: argparse.Namespace) -> None:
    """Run each policy on the same requests; print the table and the reductions."""
    rows: dict[str, dict[str, Any]] = {}
    for policy in POLICIES:
        print(f"running {policy} on the first {args.requests} requests ...", file=sys.stderr)
        rows[policy] = run_policy(policy, args)
    first = rows[POLICIES[0]]
    print(
        f"\nprefix cache: {args.trace.name}, first {first['requests']} requests at "
        f"{first['rate']:.2f} req/s over {first['window']:.0f} s (real-world), time_scale "
        f"{args.time_scale:g}\n"
    )
    hdr = (
        f"{'policy':15} {'requests':>8} {'done':>5} {'cross-DC GB':>11} {'(KV + pulls)':>15} "
        f"{'TTFT mean':>9} {'TTFT p90':>8} {'hits PrfaaS':>11} {'hits local':>10} "
        f"{'pulls ok/asked':>14} {'routes':>22}"
    )
    print(hdr)
    print("-" * len(hdr))
    for policy, r in rows.items():
        routes = ", ".join(f"{k} {v}" for k, v in sorted(r["routes"].items()))
        split = f"({r['kv_gb']:.1f} + {r['pull_gb']:.1f})"
        pulls = f"{r['pulls']['ok']}/{r['pulls']['asked']}"
        print(
            f"{policy:15} {r['requests']:>8d} {r['completed']:>5d} {r['cross_dc_gb']:>11.1f} "
            f"{split:>15} {r['ttft_mean']:>8.2f}s "
            f"{r['ttft_p90_s']:>7.2f}s {r['hit_prfaas']:>11,d} {r['hit_local']:>10,d} "
            f"{pulls:>14} {routes:>22}"
        )
    a, b = rows["prfaas"], rows["prfaas-nocache"]
    print(
        "\ncache-aware vs cache-blind: cross-DC bytes "
        f"{reduction(a['cross_dc_gb'], b['cross_dc_gb'])}, mean TTFT "
        f"{reduction(a['ttft_mean'], b['ttft_mean'])}, p90 TTFT "
        f"{reduction(a['ttft_p90_s'], b['ttft_p90_s'])} (positive = cache-aware lower)"
    )
    hits_a = (a["hit_prfaas"] + a["hit_local"]) / a["input_tokens"]
    hits_b = (b["hit_prfaas"] + b["hit_local"]) / b["input_tokens"]
    print(
        f"prefix tokens reused: {hits_a:.1%} of input (cache-aware) vs {hits_b:.1%} "
        f"(cache-blind); pulls skipped (local -> PrfaaS, not carried): {a['pulls']['skipped']}"
    )
    for policy, r in rows.items():
        te = r["timing_error"]
        print(
            f"{policy}: {r['wall_s']:.0f} s wall, worst engine timing error "
            f"{'-' if te is None else f'{te:.1%}'}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
