"""Where a policy's simulation time goes: the run its routes make, its control loops, its decisions.

Issue #35 asks that `prfaas` and `prfaas-predict` each simulate the shared trace in at most
1.3x the time of `prfaas-static`. The three policies do not simulate the same run: each routes
differently, so the sim moves different KV across the link and fills different caches. This
script splits each policy's simulation into parts by replaying its routes:

1. the policy's own run;
2. `replay`: a policy that gives each request the route the run gave it (one dict lookup) and
   runs no control loop: the simulation of those routes alone;
3. `replay` with the short-term loop running (if the policy runs it), its threshold unused;
4. `replay` with both loops (if the policy runs the long-term loop).

Every replay must write the run's requests.jsonl byte for byte, so it simulates the same events
(the "same run" column says whether it did). The parts: routes = (2); short-term loop =
(3) - (2); long-term loop = (4) - (3); decisions = (1) - the last replay, i.e. the policy's
`decide` and its snapshot and lookups, beyond a dict lookup. (A policy that reads the link
without re-planning, `link_view`, has the link sampling it asks for counted in its decisions.)

    python bench/sim_cost_split.py --trace ../shared/traces/mooncake_synthetic_trace.jsonl \\
        [--policy prfaas-static --policy prfaas ...] [--repeat 3] [--instructions] \\
        [--report bench/reports/sim_cost_split.md]

CPU seconds (medians of `--repeat` runs pinned to one core, as bench/sim_speed.py runs them),
or, with `--instructions`, the instructions callgrind counts in the simulation (one run each:
the count does not depend on the host's load; about 30x slower).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any, ClassVar

import sim_speed
from provenance import markdown_section  # bench/ is on sys.path
from sim_speed import (
    ROOT,
    add_trace_options,
    compile_package,
    run_argv,
    scenario_for_runs,
    timed_simulate,
)

ROUTES = "SIM_COST_SPLIT_ROUTES"
"""The child's environment: the requests.jsonl whose routes the replay gives."""
LOOPS = "SIM_COST_SPLIT_LOOPS"
"""The child's environment: the replay's loops, "", "short" or "both"; the policy it replays
(its other facts) in SIM_COST_SPLIT_OF."""
OF = "SIM_COST_SPLIT_OF"
REPLAY = "replay"


def replay_policy(routes_file: Path, of: str, loops: str) -> type:
    """A policy class that routes each request as `routes_file` says, with the facts of policy
    `of` (deployment, threshold, cache awareness) and the control loops `loops` names."""
    from testbed.policy import get_policy
    from testbed.policy.base import RequestView, Route, Snapshot

    runs = {}
    for line in routes_file.read_text().splitlines():
        rec = json.loads(line)
        runs[rec["id"]] = rec
    base = get_policy(of)

    class Replay:
        name: ClassVar[str] = REPLAY
        deployment_kind = base.deployment_kind
        needs_threshold = base.needs_threshold
        cache_aware = base.cache_aware
        replans: ClassVar[bool] = loops in ("short", "both")
        long_term: ClassVar[bool] = loops == "both"

        def decide(self, request: RequestView, snapshot: Snapshot) -> Route:
            rec = runs[request.id]
            cluster, pull = rec["route"], rec["pull_tokens"] or 0
            if pull:  # the prefix is pulled across first: prefill starts from the longer one
                cached = max(request.cached_local, request.cached_prfaas)
            else:
                cached = request.cached_local if cluster == "local" else request.cached_prfaas
            return Route(cluster, rec["prefill_instance"], rec["decode_instance"],
                         max(request.input_tokens - cached, 0), rec["threshold_tokens"],
                         pull)  # fmt: skip

    return Replay


def child(spec_path: str) -> int:
    """Run the command in this process with the simulation timed, the replay registered."""
    spec = json.loads(Path(spec_path).read_text())
    if os.environ.get(ROUTES):
        from testbed.policy import POLICIES

        POLICIES.register(replay_policy(Path(os.environ[ROUTES]), os.environ[OF],
                                        os.environ[LOOPS]))  # fmt: skip
    cpu, _ = timed_simulate()
    from testbed.cli import main as cli

    rc = cli(spec["argv"])
    out = Path(spec["argv"][spec["argv"].index("--out") + 1]) / "requests.jsonl"
    digest = hashlib.sha256(out.read_bytes()).hexdigest() if out.exists() else ""
    Path(spec["result"]).write_text(json.dumps({"rc": rc, "simulate_cpu_s": sum(cpu),
                                                "requests_sha256": digest}))  # fmt: skip
    return 0


def one_run(
    args: argparse.Namespace,
    policy: str,
    keep: Path | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One child run of `testbed run` under `policy` (bench/sim_speed.py's `one_run`, with this
    script's child and `env` added to its environment); `keep`: copy its requests.jsonl
    there."""
    argv = run_argv(args.run_scenario, args.duration, args.trace, policy, args.set)
    with tempfile.TemporaryDirectory() as d:
        cpu = args.cpu if args.cpu >= 0 else None
        row = sim_speed.one_run(ROOT, argv, cpu, Path(d), args.instructions,
                                script=Path(__file__).resolve(), env=env)  # fmt: skip
        if keep is not None:
            keep.write_bytes((Path(d) / "out" / "requests.jsonl").read_bytes())
    return row


def variants(policy: str) -> list[tuple[str, str]]:
    """(part, loops) of the replays of `policy`: none, then the loops it runs, one by one."""
    from testbed.policy import get_policy

    cls = get_policy(policy)
    out = [("routes", "")]
    if cls.replans:
        out.append(("short-term loop", "short"))
    if cls.long_term:
        out.append(("long-term loop", "both"))
    return out


def measure(args: argparse.Namespace, policy: str, tmp: Path) -> dict[str, Any]:
    """The policy's run and its replays, `--repeat` times; medians of each."""
    unit = "simulate_instructions" if args.instructions else "simulate_cpu_s"
    routes = tmp / f"{policy}.requests.jsonl"
    runs: dict[str, list[float]] = {}
    same: dict[str, bool] = {}
    for r in range(args.repeat):
        row = one_run(args, policy, keep=routes if r == 0 else None)
        runs.setdefault("run", []).append(row[unit])
        digest = row["requests_sha256"]
        for part, loops in variants(policy):
            replayed = one_run(args, REPLAY, env={ROUTES: str(routes), OF: policy, LOOPS: loops})
            runs.setdefault(part, []).append(replayed[unit])
            same[part] = same.get(part, True) and replayed["requests_sha256"] == digest
        print(f"run {r} {policy:16} " + ", ".join(f"{k} {v[-1]:.4g}" for k, v in runs.items()),
              flush=True)  # fmt: skip
    return {"medians": {k: statistics.median(v) for k, v in runs.items()}, "same": same}


def table(results: dict[str, dict[str, Any]], instructions: bool) -> str:
    """Each policy's parts, and its run over the first policy's."""
    unit = "G instructions" if instructions else "CPU s"
    scale = 1e-9 if instructions else 1.0
    first = next(iter(results.values()))["medians"]["run"]
    out = [f"| policy | run, {unit} | run / {next(iter(results))} | routes | short-term loop "
           "| long-term loop | decisions | replays the same run |",
           "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for policy, res in results.items():
        m = res["medians"]
        parts = {"routes": m["routes"]}
        last = m["routes"]
        for part in ("short-term loop", "long-term loop"):
            if part in m:
                parts[part] = m[part] - last
                last = m[part]
        parts["decisions"] = m["run"] - last

        def cell(part: str, parts: dict[str, float] = parts) -> str:
            if part not in parts:
                return "-"
            return f"{parts[part] * scale:.3f} ({parts[part] / first:.2f})"

        same = "yes" if all(res["same"].values()) else "**no**"
        out.append(f"| {policy} | {m['run'] * scale:.3f} | {m['run'] / first:.2f}x | "
                   f"{cell('routes')} | {cell('short-term loop')} | {cell('long-term loop')} | "
                   f"{cell('decisions')} | {same} |")  # fmt: skip
    note = (f"\nParts in {unit}, each (in brackets) as a share of {next(iter(results))}'s run; "
            "the parts of a policy add up to its run.\n")  # fmt: skip
    return "\n".join(out) + "\n" + note


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_trace_options(ap, "policy to split (repeatable)")
    ap.add_argument(
        "--instructions",
        action="store_true",
        help="count instructions under valgrind's callgrind instead of CPU seconds",
    )
    args = ap.parse_args()
    if args.child:
        return child(args.child)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    if args.trace is not None and not args.trace.is_file():
        ap.error(f"--trace {args.trace}: no such file")
    if args.instructions and not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        ap.error("--instructions needs valgrind and callgrind_control (Debian: valgrind)")
    args.run_scenario = scenario_for_runs(args.scenario)
    policies = args.policy or ["prfaas-static", "prfaas", "prfaas-predict"]
    load_before = os.getloadavg()
    compile_package(ROOT)
    with tempfile.TemporaryDirectory() as d:
        results = {p: measure(args, p, Path(d)) for p in policies}
    text = table(results, args.instructions)
    print(text)
    if args.report is not None:
        if not args.report.exists():
            title = __doc__.splitlines()[0].rstrip(".")
            args.report.write_text(f"# {title} (bench/sim_cost_split.py)\n")
        how = ("instructions counted by callgrind, one run each" if args.instructions
               else f"medians of {args.repeat} runs pinned to core {args.cpu}")  # fmt: skip
        trace = f", trace {args.trace.name}" if args.trace else ""
        setup = f"{args.scenario} on the sim substrate, its seed{trace}; {how}"
        name, unit = (("cost_split-instructions", "instructions") if args.instructions
                      else ("cost_split-cpu", "CPU seconds"))  # fmt: skip
        markdown_section(args.report, name, f"Where each policy's simulation goes, in {unit}",
                         load_before, setup, text)  # fmt: skip
    diverged = [p for p, res in results.items() if not all(res["same"].values())]
    if diverged:  # its parts would be another run's: said, and the exit status says so too
        print(f"a replay of {', '.join(diverged)} did not write the run's requests.jsonl")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
