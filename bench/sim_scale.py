"""The sim at 10K-GPU scale (issue #15, acceptance 4): the paper's prfaas-pd deployment scaled
about 100x (4 + 8 eight-GPU instances x FACTOR: 416 H200 + 832 H20 instances, 9,984 GPUs at the
default 104), its link scaled by the same factor, prfaas-static at 80% of the planner's
lambda_max, for one simulated hour.

The scenario is scenarios/paper.yaml with the instance counts, the link bandwidth and the
duration replaced (in memory; `--write-scenario PATH` saves it, so `testbed run PATH --substrate
sim` runs the same thing). The records go to OUT/requests.jsonl as they finish and the history
to OUT/history.jsonl, as `testbed run --substrate sim` writes them (testbed.metrics.stream), and
the summary is computed from what the run kept of them (a RecordTable and a RunHistory).

Prints the planner's time (prepare_s: the run plan, requests included), simulate_s with its CPU
seconds (time.process_time), the results (results_s: history.jsonl and the summary), the peak
RSS (getrusage ru_maxrss), simulated requests per wall second, and the lines of requests.jsonl
against the requests offered. `--profile` runs the simulation under cProfile instead and prints
where its time goes.

`--repeat N` runs the hour N times, each in a process of its own (a second hour in one process
would start from the first one's heap), prints each run and judges issue #35's CPU target on
the median of their simulation CPU seconds: one hour's CPU seconds move by a few percent run to
run on a quiet host.

Usage: python bench/sim_scale.py [--factor 104] [--duration 3600] [--cpu 0] [--policy NAME]
    [--out DIR] [--profile] [--repeat N]
Targets: issue #15, simulate under 10 minutes wall and 4 GiB RSS on one core; issue #35, the
hour in <= 120 CPU s with prfaas-static, <= 180 with prfaas, peak RSS <= 1 GiB, every request in
requests.jsonl.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from provenance import reported  # bench/ is on sys.path

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
        "--out", type=Path, help="keep requests.jsonl, history.jsonl, summary.json here"
    )
    ap.add_argument(
        "--policy", default="prfaas-static", help="e.g. prfaas: the re-planning scheduler loops"
    )
    ap.add_argument("--report", type=Path, metavar="FILE", help="also write the output here")
    ap.add_argument(
        "--repeat", type=int, default=1, metavar="N",
        help="run the hour N times, each in its own process; the CPU target is judged on the "
        "median",
    )  # fmt: skip
    args = ap.parse_args()
    if args.report is not None and args.profile:
        ap.error("--report takes the measured run, not --profile's")
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    if args.repeat > 1 and (args.profile or args.write_scenario or args.out):
        ap.error("--repeat measures: not with --profile, --write-scenario or --out")
    if args.cpu >= 0:
        os.sched_setaffinity(0, {args.cpu})
    setup = (
        f"sim; scenarios/paper.yaml's prfaas-pd x{args.factor} under {args.policy}, "
        f"{args.duration:.0f} s, the scenario's seed; pinned to core "
        f"{args.cpu if args.cpu >= 0 else 'none'}"
    )
    name, heading = f"sim_scale-{args.policy}", f"At 10K-GPU scale, {args.policy}"
    run = measure if args.repeat == 1 else repeated
    return reported(args.report, name, heading, setup, lambda: run(args))


def cpu_target(policy: str) -> int:
    """Issue #35's CPU seconds for the hour: 120 under prfaas-static, 180 under the others."""
    return 120 if policy == "prfaas-static" else 180


SIMULATED_CPU = re.compile(r"^simulate_s \S+ \(cpu (\S+)\).*RSS peak (\S+) GiB", re.M)
"""A run's line with the simulation's CPU seconds and the peak RSS."""


@dataclass(frozen=True)
class Hours:
    """The hour run several times: each run's simulation CPU seconds and peak RSS (GiB), and
    whether every run wrote every request to requests.jsonl."""

    cpu: list[float]
    rss: list[float]
    every: bool


def hours(factor: int, duration: float, cpu: int, policy: str, repeat: int) -> Hours:
    """The hour `repeat` times, one child process each (this script without `--repeat` and
    `--report`: a second hour in one process would start from the first one's heap), every
    run's output printed as it ends. bench/sim_targets.py asks for it too."""
    argv = [sys.executable, __file__, "--factor", str(factor), "--duration", str(duration),
            "--cpu", str(cpu), "--policy", policy]  # fmt: skip
    seconds: list[float] = []
    rss: list[float] = []
    every = True
    for i in range(repeat):
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        print(f"run {i + 1} of {repeat}:")
        print(done.stdout.rstrip(), flush=True)
        found = SIMULATED_CPU.search(done.stdout)
        if done.returncode != 0 or found is None:
            raise SystemExit(f"run {i + 1} failed ({done.returncode}):\n{done.stderr[-2000:]}")
        seconds.append(float(found[1]))
        rss.append(float(found[2]))
        every = every and "(every one)" in done.stdout
    return Hours(seconds, rss, every)


def repeated(args: argparse.Namespace) -> int:
    """`--repeat N`: the hour N times (`hours`), then the median judged."""
    h = hours(args.factor, args.duration, args.cpu, args.policy, args.repeat)
    cpu, rss, every = h.cpu, h.rss, h.every
    median = statistics.median(cpu)
    target = cpu_target(args.policy)
    print(
        f"median of {args.repeat} runs: simulate CPU {median:.1f} s [{min(cpu):.1f}-"
        f"{max(cpu):.1f}], peak RSS {max(rss):.2f} GiB at most; issue #35 (CPU <= {target} s "
        f"for {args.policy}, peak RSS <= 1 GiB, every request in requests.jsonl): CPU "
        f"{'met' if median <= target else 'NOT met'}, RSS {'met' if max(rss) <= 1 else 'NOT met'}"
        f", requests {'met' if every else 'NOT met'}"
    )
    return 0


def measure(args: argparse.Namespace) -> int:
    """Run the scaled hour once (or under cProfile) and print what it cost."""

    from testbed.clock import Scale
    from testbed.metrics.files import write_jsonl_atomic
    from testbed.metrics.stream import RecordStream
    from testbed.metrics.summary import summarize
    from testbed.scenario.plan import prepare_run
    from testbed.scenario.schema import Scenario
    from testbed.scenario.sim_run import sim_inputs
    from testbed.scenario.sweep import sim_options
    from testbed.sim import simulate

    raw = scaled_scenario(args.factor, args.duration, args.policy)
    if args.write_scenario:
        args.write_scenario.write_text(yaml.safe_dump(raw, sort_keys=False))
    scenario = Scenario.model_validate(raw)
    opts = sim_options(max_requests=10_000_000)  # the hour plans ~1.008M: over the default cap
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
    out_dir = args.out or Path(tempfile.mkdtemp(prefix="sim_scale-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    stream = RecordStream(out_dir / "requests.jsonl")
    if args.profile:
        prof = cProfile.Profile()
        out = prof.runcall(simulate, inp, stream)
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        if args.out is None:
            shutil.rmtree(out_dir)
        return 0
    t0 = time.perf_counter()
    c0 = time.process_time()
    out = simulate(inp, stream)
    simulate_s = time.perf_counter() - t0
    cpu_s = time.process_time() - c0
    rss_sim = rss_gib()
    assert out.table is not None and out.run_history is not None
    t0 = time.perf_counter()
    c0 = time.process_time()
    write_jsonl_atomic(out_dir / "history.jsonl", out.run_history.docs())
    sc = rp.scenario
    summary = summarize(
        out.table, out.run_history, duration_s=rp.duration_s, slo=sc.slo, scale=Scale.of(sc.scale)
    )
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    results_s = time.perf_counter() - t0
    results_cpu = time.process_time() - c0
    n = len(out.submitted)
    with (out_dir / "requests.jsonl").open("rb") as fh:
        lines = sum(1 for _ in fh)
    print(
        f"simulate_s {simulate_s:.1f} (cpu {cpu_s:.1f})  results_s {results_s:.1f} (cpu "
        f"{results_cpu:.1f}: history.jsonl and the summary)  "
        f"RSS peak {rss_gib():.2f} GiB (after simulate {rss_sim:.2f})  "
        f"{n / simulate_s:.0f} req/wall s  x{args.duration / simulate_s:.0f} real time"
    )
    print(
        f"requests {n} completed {summary['requests']['completed']} failed "
        f"{summary['requests']['failed']}; throughput {summary['throughput_rps']:.1f} req/s, "
        f"TTFT p50 {summary['ttft_s']['p50']:.2f}s p90 {summary['ttft_s']['p90']:.2f}s; "
        f"history events {len(out.run_history)}; notes {out.notes}"
    )
    print(
        f"requests.jsonl {lines} lines for {len(rp.requests)} requests offered "
        f"({'every one' if lines == len(rp.requests) else 'NOT every one'})"
        + (f"; files in {out_dir}" if args.out else "")
    )
    if args.out is None:
        shutil.rmtree(out_dir)
    rss_ok = rss_gib() < 4
    print(
        f"target (simulate < 600 s on one core, RSS < 4 GiB): wall {simulate_s:.0f} s "
        f"{'met' if simulate_s < 600 and rss_ok else 'NOT met'}; CPU {cpu_s:.0f} s "
        f"{'met' if cpu_s < 600 and rss_ok else 'NOT met'} (wall exceeds CPU when other jobs "
        "share the core)"
    )
    target = cpu_target(args.policy)
    print(
        f"issue #35 (CPU <= {target} s for {args.policy}, peak RSS <= 1 GiB, every request "
        f"in requests.jsonl): CPU {cpu_s:.0f} s {'met' if cpu_s <= target else 'NOT met'}, "
        f"RSS {rss_gib():.2f} GiB {'met' if rss_gib() <= 1 else 'NOT met'}, requests "
        f"{'met' if lines == len(rp.requests) else 'NOT met'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
