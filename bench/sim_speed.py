"""How fast the sim substrate runs the paper's workload: one simulated hour at 80% of
lambda_max on the prfaas-pd deployment (scenarios/paper.yaml, about 9,300 requests).

Runs `testbed run scenarios/paper.yaml --substrate sim --duration 3600` as a command pinned to
one core and prints the summary's wall timings (simulate_s, results_s, total_s), the command's
wall and CPU seconds, simulated requests per wall second and the speed-up over real time.
`--profile` then profiles the simulation alone (in this process) and prints where its time goes.

Usage: python bench/sim_speed.py [--duration 3600] [--repeat 3] [--cpu 0] [--profile]
The target (issue #15): simulate_s <= 1.2 s on one core, the whole command < 10 s.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_run(duration: float, cpu: int | None, out: Path) -> dict[str, float]:
    cmd = [sys.executable, "-m", "testbed.cli", "run", "scenarios/paper.yaml", "--substrate",
           "sim", "--duration", str(duration), "--quiet", "--out", str(out)]  # fmt: skip

    def pin() -> None:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(
        cmd, cwd=ROOT, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        preexec_fn=pin,
    )  # fmt: skip
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    summary = json.loads((out / "summary.json").read_text())
    return {
        **summary["wall"],
        "command_s": wall,
        "cpu_s": cpu_s,
        "requests": summary["requests"]["submitted"],
        "failed": summary["requests"]["failed"],
    }


def profile(duration: float) -> None:
    from testbed.scenario.plan import RunOptions, prepare_run
    from testbed.scenario.schema import load_scenario
    from testbed.scenario.sim_run import sim_inputs
    from testbed.sim import simulate

    opts = RunOptions(substrate="sim", duration_s=duration, out_dir=Path(tempfile.mkdtemp()))
    inp = sim_inputs(prepare_run(load_scenario(ROOT / "scenarios/paper.yaml"), opts), opts)
    t0 = time.process_time()
    simulate(inp)
    print(f"\nsimulate alone, in process: {time.process_time() - t0:.3f} CPU s (no profiler)")
    prof = cProfile.Profile()
    prof.runcall(simulate, inp)
    pstats.Stats(prof).sort_stats("tottime").print_stats(15)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=3600.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cpu", type=int, default=0, help="core to pin the command to (-1: none)")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    cpu = None if args.cpu < 0 else args.cpu
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            rows.append(one_run(args.duration, cpu, Path(tmp) / f"run{i}"))
    print(f"paper.yaml, prfaas-pd at 80% of lambda_max, {args.duration:.0f}s simulated, "
          f"pinned to core {cpu}; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"{'run':>3} {'requests':>8} {'simulate_s':>10} {'results_s':>9} {'total_s':>7} "
          f"{'command_s':>9} {'cpu_s':>6} {'req/wall s':>10} {'x real':>7}")  # fmt: skip
    for i, r in enumerate(rows):
        sim = r["simulate_s"]
        print(f"{i:>3} {r['requests']:>8.0f} {sim:>10.3f} {r['results_s']:>9.3f} "
              f"{r['total_s']:>7.3f} {r['command_s']:>9.3f} {r['cpu_s']:>6.2f} "
              f"{r['requests'] / sim:>10.0f} {args.duration / sim:>7.0f}")  # fmt: skip
    best = min(rows, key=lambda r: r["simulate_s"])
    print(f"best simulate_s {best['simulate_s']:.3f} s (target <= 1.2 s); "
          f"best command {min(r['command_s'] for r in rows):.2f} s (target < 10 s)")  # fmt: skip
    if args.profile:
        profile(args.duration)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
