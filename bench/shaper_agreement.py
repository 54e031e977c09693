"""Do the two link shapers agree? The link emulator's shared token bucket (`shaper: emulator`)
against the kernel's htb class on a veth between the run's network namespaces (`shaper: tc`),
on the local substrate, same scenarios and seeds.

Two scenarios, each run `--runs` times per shaper with seeds seed, seed+1, ... (the same seeds
for both shapers, so run i of each sees the same requests):

- burst (scenarios/burst.yaml): on/off arrivals at 80% of lambda_max over a 100 Gbps link;
- bandwidth-drop (scenarios/bandwidth-drop.yaml, prfaas-static): 100 -> 5 Gbps for 60 s; also
  the P90 TTFT of the requests that arrived during the drop, where the shaper is the bottleneck.

For each scenario and shaper: TTFT p50 and p90 (real-world seconds), as the mean over runs with
the min-max spread. The shapers agree on a figure when their spreads overlap. Since the runs
use different seeds, the spread is mostly the workload's; the paired difference (tc minus
emulator, same seed) is printed too. Requires root
(tc). --quick: one run each with shortened scenarios (a smoke test of the script, not figures).

Usage: python bench/shaper_agreement.py [--runs 3] [--quick] [--report FILE]
About 6 minutes on a quiet 2-core machine with the defaults.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np
from provenance import (  # bench/provenance.py: the script's directory is on sys.path
    provenance,
    with_header,
)

from testbed.experiment import percentile, run_scenario_once, ttft_p90
from testbed.metrics.records import RequestRecord
from testbed.scenario.schema import Scenario, load_scenario

ROOT = Path(__file__).resolve().parents[1]
SHAPERS = ("emulator", "tc")
DROP = (60.0, 120.0)
"""Real-world seconds of bandwidth-drop's bandwidth action."""


def _scenarios(quick: bool) -> list[tuple[str, Scenario, str | None, float | None]]:
    """(label, scenario, policy override, duration override)."""
    burst = load_scenario(ROOT / "scenarios" / "burst.yaml")
    drop = load_scenario(ROOT / "scenarios" / "bandwidth-drop.yaml")
    return [
        ("burst", burst, None, 60.0 if quick else None),
        ("bandwidth-drop", drop, "prfaas-static", 130.0 if quick else None),
    ]


def _one(
    scenario: Scenario, policy: str | None, duration: float | None, shaper: str, seed: int
) -> dict[str, Any]:
    result = run_scenario_once(
        scenario, "local", policy=policy, duration_s=duration, shaper=shaper, seed=seed
    )
    recs: list[RequestRecord] = result.records
    ttft = [r.ttft for r in recs if r.ttft is not None]
    failed = sum(1 for r in recs if r.status != "completed")
    return {
        "p50": percentile(ttft, 50),
        "p90": percentile(ttft, 90),
        "drop_p90": ttft_p90(recs, *DROP),
        "failed": failed,
        "requests": len(recs),
        "shaper": result.summary["link"].get("shaper"),
    }


def _spread(vals: list[float | None]) -> tuple[float, float, float] | None:
    xs = [v for v in vals if v is not None]
    return (float(np.mean(xs)), min(xs), max(xs)) if xs else None


def _fmt(s: tuple[float, float, float] | None) -> str:
    return "-" if s is None else f"{s[0]:.2f} ({s[1]:.2f}-{s[2]:.2f})"


def _overlap(a: tuple[float, float, float] | None, b: tuple[float, float, float] | None) -> str:
    if a is None or b is None:
        return "-"
    return "yes" if a[1] <= b[2] and b[1] <= a[2] else "no"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per scenario and shaper")
    ap.add_argument("--quick", action="store_true", help="one short run each (smoke test)")
    ap.add_argument("--report", help="write the table as markdown to this file")
    args = ap.parse_args()
    load_before = os.getloadavg()
    if os.geteuid() != 0:
        print("shaper_agreement: the tc shaper needs root", file=sys.stderr)
        return 2
    runs = 1 if args.quick else args.runs
    lines = [
        f"shaper agreement: {runs} run(s) per scenario and shaper, local substrate, "
        f"{platform.machine()} with {os.cpu_count()} CPUs"
        + (" (--quick: shortened scenarios)" if args.quick else ""),
        "",
        "| scenario | shaper | TTFT p50 s | TTFT p90 s | P90 TTFT during the drop s | failed |",
        "|---|---|---|---|---|---|",
    ]
    agreement = []
    for label, scenario, policy, duration in _scenarios(args.quick):
        stats: dict[str, dict[str, Any]] = {}
        per_run: dict[str, list[dict[str, Any]]] = {}
        for shaper in SHAPERS:
            got = []
            for i in range(runs):
                r = _one(scenario, policy, duration, shaper, scenario.seed + i)
                assert r["shaper"] == shaper, r
                print(f"{label} {shaper} run {i + 1}: {r}", file=sys.stderr, flush=True)
                got.append(r)
            per_run[shaper] = got
            stats[shaper] = {
                k: _spread([g[k] for g in got]) for k in ("p50", "p90", "drop_p90")
            } | {"failed": sum(g["failed"] for g in got)}
            s = stats[shaper]
            drop = _fmt(s["drop_p90"]) if label == "bandwidth-drop" else "-"
            lines.append(
                f"| {label} | {shaper} | {_fmt(s['p50'])} | {_fmt(s['p90'])} | {drop} | "
                f"{s['failed']} |"
            )
        e, t = stats["emulator"], stats["tc"]
        keys = ("p50", "p90", "drop_p90") if label == "bandwidth-drop" else ("p50", "p90")
        paired = []
        for k in keys:
            diffs = [
                b[k] - a[k]
                for a, b in zip(per_run["emulator"], per_run["tc"], strict=True)
                if a[k] is not None and b[k] is not None
            ]
            paired.append(f"{k} " + " ".join(f"{d:+.2f}" for d in diffs))
        agreement.append(
            f"{label}: spreads overlap: "
            + ", ".join(f"{k} {_overlap(e[k], t[k])}" for k in keys)
            + "; tc - emulator per seed (s): "
            + "; ".join(paired)
        )
    lines += ["", "mean over runs (min-max); real-world seconds", "", *agreement]
    text = "\n".join(lines)
    print(text)
    if args.report:
        setup = (
            "local (live), shapers emulator and tc; each scenario's seed to seed+"
            f"{runs - 1} (burst 7-9, bandwidth-drop 11-13 with the defaults)"
        )
        head = provenance("bench/shaper_agreement.py", sys.argv[1:], load_before, setup)
        Path(args.report).write_text(with_header(f"# {text}", head) + "\n")  # a markdown title
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
