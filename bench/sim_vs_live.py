"""Sim against live: the burst scenario on the local substrate and on the sim, same seeds.

For each seed (`testbed run --seed`), runs scenarios/burst.yaml live (local processes, time
scale 10) and simulated, and prints per seed and on average: throughput, TTFT p50 and p90, the
link's mean Gbps, the share of requests routed to PrfaaS, and each checker's verdict, with the
sim's difference from live. The live runs' own seed-to-seed spread is printed too: a sim
figure within it is as close as two live runs are to each other.

Usage: python bench/sim_vs_live.py [--seeds 7 8 9] [--quick] [--scenario burst]
--quick runs one seed. About 50 s of wall per live run on 2 cores (the sim: a few seconds).
The CPU is shared with whatever else runs: live TTFTs grow when a core is busy.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path
from typing import Any

from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.runner import run_scenario
from testbed.scenario.schema import load_scenario
from testbed.scenario.sim_run import run_sim

ROOT = Path(__file__).resolve().parents[1]
METRICS = ("throughput", "ttft_p50", "ttft_p90", "link_gbps", "prfaas_share")


def figures(summary: dict[str, Any]) -> dict[str, Any]:
    routes = summary["routes"]
    total = sum(routes.values()) or 1
    return {
        "throughput": summary["throughput_rps"],
        "ttft_p50": summary["ttft_s"]["p50"],
        "ttft_p90": summary["ttft_s"]["p90"],
        "link_gbps": summary["link"]["mean_gbps"] or 0.0,
        "prfaas_share": 100.0 * routes.get("prfaas", 0) / total,
        "checks": {c["name"]: c["verdict"] for c in summary["checks"]},
    }


def run_one(scenario: str, substrate: str, seed: int, out: Path) -> dict[str, Any]:
    sc = load_scenario(ROOT / "scenarios" / f"{scenario}.yaml")
    opts = RunOptions(substrate=substrate, seed=seed, out_dir=out, progress=False)
    rp = prepare_run(sc, opts)
    result = run_sim(rp, opts) if substrate == "sim" else asyncio.run(run_scenario(rp, opts))
    return figures(result.summary)


def diff(metric: str, sim: float, live: float) -> str:
    if metric == "prfaas_share":
        return f"{sim - live:+.1f} pt"
    return f"{100 * (sim - live) / live:+.1f}%" if live else "n/a"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="burst")
    ap.add_argument("--seeds", type=int, nargs="+", default=[7, 8, 9])
    ap.add_argument("--quick", action="store_true", help="one seed (the first)")
    args = ap.parse_args()
    seeds = args.seeds[:1] if args.quick else args.seeds
    rows: dict[str, list[dict[str, Any]]] = {"local": [], "sim": []}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            for substrate in ("local", "sim"):
                out = Path(tmp) / f"{substrate}-{seed}"
                rows[substrate].append(run_one(args.scenario, substrate, seed, out))
    print(f"{args.scenario}: local vs sim, seeds {' '.join(map(str, seeds))}")
    print(f"{'metric':<14}{'seed':>6}{'local':>10}{'sim':>10}{'sim-live':>10}")
    for metric in METRICS:
        for seed, live, sim in zip(seeds, rows["local"], rows["sim"], strict=True):
            lv, sv = live[metric], sim[metric]
            print(f"{metric:<14}{seed:>6}{lv:>10.3f}{sv:>10.3f}{diff(metric, sv, lv):>10}")
        lm = statistics.mean(r[metric] for r in rows["local"])
        sm = statistics.mean(r[metric] for r in rows["sim"])
        spread = ""
        if len(seeds) > 1:
            vals = [r[metric] for r in rows["local"]]
            spread = f"  (live seed spread {min(vals):.3f}..{max(vals):.3f})"
        print(f"{metric:<14}{'mean':>6}{lm:>10.3f}{sm:>10.3f}{diff(metric, sm, lm):>10}{spread}")
    same = all(
        live["checks"] == sim["checks"]
        for live, sim in zip(rows["local"], rows["sim"], strict=True)
    )
    print(f"checker verdicts identical on every seed: {'yes' if same else 'NO'}")
    for seed, live, sim in zip(seeds, rows["local"], rows["sim"], strict=True):
        if live["checks"] != sim["checks"]:
            print(f"  seed {seed}: live {live['checks']} / sim {sim['checks']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
