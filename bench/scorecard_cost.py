"""What a scorecard over the whole library costs, cold and with the run cache warm.

    python bench/scorecard_cost.py --report bench/reports/scorecard.md

runs `testbed scorecard` three times on the sim against one fresh run cache, each as its own
child process: `--policy prfaas` (cold: its runs, the baselines' and the hindsight grid's),
then `--policy prfaas-predict` (a new policy: only its own runs, the rest from the cache), then
the same again (all cached: built-in policies' runs are kept). Prints each one's runs, cached
runs, wall seconds and CPU seconds (the child's user + system), so a user knows what a
scorecard costs before starting one (issue #37: the figure comes with its command).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import tempfile
import time
from pathlib import Path

from provenance import TESTBED, reported  # bench/ is on sys.path

ROOT = Path(__file__).resolve().parent.parent
CASES = (
    ("cold cache", "prfaas"),
    ("a new policy, cache warm", "prfaas-predict"),
    ("the same scorecard again", "prfaas-predict"),
)


def children_cpu() -> float:
    """User + system CPU seconds of every child waited for so far."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def scorecard(policy: str, cache: Path, out: Path, args: argparse.Namespace) -> dict[str, float]:
    """One `testbed scorecard` in a child process: its runs, cached runs, wall and CPU."""
    cmd = [*TESTBED, "scorecard", "--policy", policy, "--cache", str(cache), "--out", str(out)]
    cmd += ["--quiet"] + (["--seeds", args.seeds] if args.seeds else [])
    cmd += ["--scenarios", args.scenarios] if args.scenarios else []
    cpu0, t0 = children_cpu(), time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    wall, cpu = time.perf_counter() - t0, children_cpu() - cpu0
    if done.returncode not in (0, 1):  # 1: a verdict against the policy, still a scorecard
        raise SystemExit(f"testbed scorecard exited {done.returncode}:\n{done.stderr[-2000:]}")
    card = json.loads((out / "scorecard.json").read_text())
    return {"runs": card["runs"], "cached": card["cached_runs"], "wall": wall, "cpu": cpu}


def measure(args: argparse.Namespace) -> None:
    """Print the table: a row per case."""
    jobs = os.cpu_count()
    print(f"testbed scorecard on the sim, one fresh run cache, {jobs} cores (--jobs default)")
    print(f"{'case':<28}{'policy':<16}{'runs':>6}{'cached':>8}{'wall s':>9}{'CPU s':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        for i, (case, policy) in enumerate(CASES):
            r = scorecard(policy, cache, Path(tmp) / f"card-{i}", args)
            print(
                f"{case:<28}{policy:<16}{r['runs']:>6.0f}{r['cached']:>8.0f}"
                f"{r['wall']:>9.1f}{r['cpu']:>8.1f}"
            )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", help="testbed scorecard's --seeds (default: its 1,2,3)")
    ap.add_argument("--scenarios", help="testbed scorecard's --scenarios (default: the library)")
    ap.add_argument("--report", type=Path, metavar="FILE", help="also write the table here")
    args = ap.parse_args()
    seeds = args.seeds or "1,2,3"
    scenarios = args.scenarios or "the library"
    setup = f"sim; {scenarios}, seeds {seeds}, baselines prfaas and prfaas-static, hindsight"
    heading = "What a library run costs"
    reported(args.report, "scorecard_cost", heading, setup, lambda: measure(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
