"""The sim at 10K-GPU scale (issue #15, acceptance 4): the paper's prfaas-pd deployment scaled
about 100x (4 + 8 eight-GPU instances x FACTOR: 416 H200 + 832 H20 instances, 9,984 GPUs at the
default 104), its link scaled by the same factor, prfaas-static at 80% of the planner's
lambda_max, for one simulated hour.

The scenario is scenarios/paper.yaml with the instance counts, the link bandwidth and the
duration replaced (in memory; `--write-scenario PATH` saves it, so `testbed run PATH --substrate
sim` runs the same thing). Prints the planner's time (prepare_s: the run plan, requests
included), simulate_s, the results' summary (results_s), the peak RSS (getrusage ru_maxrss) and
simulated requests per wall second. `--profile` runs the simulation under cProfile instead and
prints where its time goes.

Usage: python bench/sim_scale.py [--factor 104] [--duration 3600] [--cpu 0] [--profile]
Target (issue #15): simulate under 10 minutes wall and 4 GiB RSS on one core.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import resource
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]


def scaled_scenario(factor: int, duration: float, policy: str) -> dict[str, Any]:
    """paper.yaml's prfaas-pd deployment with every count and the link times `factor`."""
    raw = yaml.safe_load((ROOT / "scenarios/paper.yaml").read_text())
    dep = raw["deployments"]["prfaas-pd"]
    dep["prfaas"]["instances"] *= factor
    dep["local"]["instances"] *= factor
    dep["link"]["bandwidth"] = f"{100 * factor}Gbps"
    raw["deployments"] = {"prfaas-pd": dep}
    raw["deployment"] = "prfaas-pd"
    raw["duration"] = f"{duration:g}s"
    raw["description"] = f"paper.yaml's prfaas-pd x{factor} (bench/sim_scale.py)"
    raw["checkers"] = [{"check": "failures", "max_fraction": 0}]
    raw["policy"]["name"] = policy
    return raw


def rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--factor", type=int, default=104)
    ap.add_argument("--duration", type=float, default=3600.0)
    ap.add_argument("--cpu", type=int, default=0, help="core to pin to (-1: none)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--write-scenario", type=Path)
    ap.add_argument(
        "--policy", default="prfaas-static", help="e.g. prfaas: the re-planning scheduler loops"
    )
    args = ap.parse_args()
    if args.cpu >= 0:
        os.sched_setaffinity(0, {args.cpu})

    from testbed.scenario.plan import prepare_run
    from testbed.scenario.schema import Scenario
    from testbed.scenario.sim_run import sim_inputs
    from testbed.scenario.sweep import plan_summary, sim_options
    from testbed.sim import simulate

    raw = scaled_scenario(args.factor, args.duration, args.policy)
    if args.write_scenario:
        args.write_scenario.write_text(yaml.safe_dump(raw, sort_keys=False))
    scenario = Scenario.model_validate(raw)
    opts = sim_options()
    t0 = time.perf_counter()
    rp = prepare_run(scenario, opts)
    prepare_s = time.perf_counter() - t0
    dep = rp.deployment
    n_inst = (dep.prfaas.instances if dep.prfaas else 0) + dep.local.instances
    print(
        f"paper.yaml prfaas-pd x{args.factor}, {rp.policy}: {n_inst} instances, "
        f"{rp.plan.gpus} GPUs, link "
        f"{dep.link.bandwidth * 8 / 1e12:.1f} Tbps; plan lambda_max {rp.plan.lambda_max_rps:.1f}"
        f" req/s, N_p/N_d {rp.n_prefill}/{rp.n_decode}, t={rp.threshold_tokens}; "
        f"{len(rp.requests)} requests over {args.duration:.0f}s; pinned to core "
        f"{args.cpu if args.cpu >= 0 else 'none'}, load average {os.getloadavg()[0]:.1f}"
    )
    print(f"prepare_s {prepare_s:.2f} (planner search + requests)  RSS {rss_gib():.2f} GiB")
    inp = sim_inputs(rp, opts)
    if args.profile:
        prof = cProfile.Profile()
        out = prof.runcall(simulate, inp)
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return 0
    t0 = time.perf_counter()
    c0 = time.process_time()
    out = simulate(inp)
    simulate_s = time.perf_counter() - t0
    cpu_s = time.process_time() - c0
    rss_sim = rss_gib()
    t0 = time.perf_counter()
    summary = plan_summary(rp, out.records, out.history)
    results_s = time.perf_counter() - t0
    n = len(out.submitted)
    print(
        f"simulate_s {simulate_s:.1f} (cpu {cpu_s:.1f})  results_s {results_s:.1f}  "
        f"RSS peak {rss_gib():.2f} GiB (after simulate {rss_sim:.2f})  "
        f"{n / simulate_s:.0f} req/wall s  x{args.duration / simulate_s:.0f} real time"
    )
    print(
        f"requests {n} completed {summary['requests']['completed']} failed "
        f"{summary['requests']['failed']}; throughput {summary['throughput_rps']:.1f} req/s, "
        f"TTFT p50 {summary['ttft_s']['p50']:.2f}s p90 {summary['ttft_s']['p90']:.2f}s; "
        f"history events {len(out.history)}; notes {out.notes}"
    )
    rss_ok = rss_gib() < 4
    print(
        f"target (simulate < 600 s on one core, RSS < 4 GiB): wall {simulate_s:.0f} s "
        f"{'met' if simulate_s < 600 and rss_ok else 'NOT met'}; CPU {cpu_s:.0f} s "
        f"{'met' if cpu_s < 600 and rss_ok else 'NOT met'} (wall exceeds CPU when other jobs "
        "share the core)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
