"""How fast the sim substrate runs a scenario, in CPU seconds: the simulation and the command.

Each run is the command `testbed run SCENARIO --substrate sim ...` in a child process pinned to
one core (`testbed.cli.main` called by this file's `--child` mode, with the simulate call timed
in process CPU seconds); the parent reads the child's whole CPU (interpreter start-up, imports,
planning, simulation, results) from getrusage. CPU seconds, not wall: the machine is shared and
another job on the core stretches wall time far more than CPU time. The median of `--repeat`
runs is reported per policy, with the load average before and after and the commit. The
runs read the package's bytecode from __pycache__ (compiled once before them), as an
installed `testbed` does, whatever the caller's PYTHONDONTWRITEBYTECODE says.

    python bench/sim_speed.py                       # paper.yaml, prfaas-pd at 80%, one hour
    python bench/sim_speed.py --scenario scenarios/mooncake-trace.yaml \\
        --trace ../shared/traces/mooncake_synthetic_trace.jsonl --duration 1100 \\
        --set workload.arrivals.load=null \\
        --policy prfaas-static --policy prfaas --policy prfaas-predict --repeat 5 \\
        [--times 10 [--per-copy]] [--src /tmp/before]
        [--report bench/reports/sim_speed.md [--append]] [--no-timeline] [--title "what changed"]

`--times N` replays the trace N times end to end (hash ids offset per copy, so each copy meets
the prefix cache as the first did; the duration is multiplied by N). `--per-copy` also splits
each run at its copies' ends and reports each copy's CPU seconds (and instructions), the drain
after the last apart (bench/per_copy.py). `--src DIR` (repeatable)
also runs the code of another checkout of the project (on PYTHONPATH), interleaved with this
one run by run, so a before/after comparison sees the same load. `--profile` then profiles the
simulation of the first policy in this process and prints where its time goes.

`--instructions` also counts the instructions each run executes, the simulation alone and the
whole command, under valgrind's callgrind (about 30x slower, so use `--repeat 1`): CPU seconds
on a shared host vary by a quarter between runs of the same code, while two counts of the same
code differ by about 0.1%, loaded host or quiet, so a small change shows in the count where the
seconds hide it. The child asks callgrind (`callgrind_control -d`) for a dump as the simulation
starts and as it ends; the second holds the simulation's count. It runs with PYTHONHASHSEED=0
(string hashing otherwise moves the count run to run); its CPU seconds are then valgrind's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import per_copy  # bench/ is on sys.path
from provenance import changed, commit, provenance

ROOT = Path(__file__).resolve().parents[1]


COUNTING = "SIM_SPEED_CALLGRIND"
"""Set in a child's environment when it runs under callgrind (`--instructions`)."""
SIMULATED = "simulated"
"""The reason the child gives callgrind for the dump that ends a simulation."""


def _dump(reason: str) -> None:
    """Ask the callgrind running this process to dump (and zero) its counts now."""
    subprocess.run(["callgrind_control", "-d", reason, str(os.getpid())],
                   check=True, capture_output=True)  # fmt: skip


def timed_simulate(copies: int = 0) -> tuple[list[float], list[float]]:
    """Time every simulate call of this process in process CPU seconds, appended to the first
    list returned (and, under `--instructions`, ask callgrind for a dump around each). With
    `copies` (`--per-copy`), the second list gets each copy's seconds and the drain's
    (bench/per_copy.py; under callgrind a dump as each copy ends)."""
    import testbed.scenario.sim_run as sim_run

    simulate = sim_run.simulate
    cpu: list[float] = []
    each: list[float] = []
    counting = os.environ.get(COUNTING) == "1"

    def timed(inp: Any, *args: Any, **kwargs: Any) -> Any:
        marks: list[float] = []
        if copies:
            marks, mark = per_copy.marker(counting, _dump)
            ends = per_copy.boundaries([r.arrival for r in inp.requests], copies)
            per_copy.mark_copies(ends, mark)
        if counting:
            _dump("before-simulation")
        t0 = time.process_time()
        try:
            return simulate(inp, *args, **kwargs)
        finally:
            t1 = time.process_time()
            cpu.append(t1 - t0)
            if copies:
                each.extend(per_copy.copy_seconds(t0, marks, t1))
            if counting:
                _dump(SIMULATED)

    sim_run.simulate = timed
    return cpu, each


def child(spec_path: str) -> int:
    """Run the command in this process with the simulate call timed (the `--child` mode)."""
    spec = json.loads(Path(spec_path).read_text())
    cpu, each = timed_simulate(spec.get("copies", 0))
    from testbed.cli import main as cli

    rc = cli(spec["argv"])
    result: dict[str, Any] = {"rc": rc, "simulate_cpu_s": sum(cpu)}
    if each:
        result["copy_cpu_s"] = each
    Path(spec["result"]).write_text(json.dumps(result))
    return 0


def tiled_trace(trace: Path, times: int, out: Path) -> Path:
    """The trace replayed `times` times end to end, each copy's hash ids offset past the last."""
    rows = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
    stamps = [r["timestamp"] for r in rows]
    span = max(stamps) + (max(stamps) - min(stamps)) / max(len(rows) - 1, 1)
    top = max((h for r in rows for h in r.get("hash_ids", [])), default=0) + 1
    with out.open("w") as f:
        for k in range(times):
            for r in rows:
                copy = dict(r, timestamp=r["timestamp"] + k * span)
                copy["hash_ids"] = [h + k * top for h in r.get("hash_ids", [])]
                f.write(json.dumps(copy) + "\n")
    return out


def run_argv(
    scenario: str,
    duration: float,
    trace: Path | None,
    policy: str | None,
    sets: list[str] | None,
    no_timeline: bool = True,
) -> list[str]:
    """`testbed run`'s arguments for one sim run (the runs of this script and of the scripts
    that use its `one_run`)."""
    argv = ["run", scenario, "--substrate", "sim", "--quiet", "--duration", str(duration)]
    if trace is not None:
        argv += ["--trace", str(trace)]
    if policy is not None:
        argv += ["--policy", policy]
    for s in sets or []:
        argv += ["--set", s]
    if no_timeline:
        argv.append("--no-timeline")
    return argv


def cli_args(args: argparse.Namespace, trace: Path | None, policy: str | None) -> list[str]:
    return run_argv(args.scenario, args.duration * args.times, trace, policy, args.set,
                    args.no_timeline)  # fmt: skip


def add_trace_options(ap: argparse.ArgumentParser, policy_help: str) -> None:
    """The options bench/sim_growth.py and bench/sim_cost_split.py share: a trace on
    scenarios/mooncake-trace.yaml at its own arrival times, runs pinned to one core."""
    ap.add_argument("--scenario", default="scenarios/mooncake-trace.yaml")
    ap.add_argument("--trace", type=Path, help="a Mooncake JSONL trace to replay")
    ap.add_argument("--duration", type=float, default=1100.0, help="seconds (of one copy)")
    ap.add_argument("--policy", action="append", help=policy_help)
    ap.add_argument("--set", action="append", default=["workload.arrivals.load=null"],
                    help="PATH=VALUE, as testbed run's (repeatable)")  # fmt: skip
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cpu", type=int, default=1, help="core to pin the runs to (-1: none)")
    ap.add_argument("--report", type=Path, help="write the figures as markdown here")
    ap.add_argument("--child", help=argparse.SUPPRESS)


def child_env(src: Path) -> dict[str, str]:
    """The runs' environment: `src` on PYTHONPATH, and bytecode read from (and written to)
    __pycache__ as an installed tool's is, even when the caller's environment says
    PYTHONDONTWRITEBYTECODE: compiling the package's ~135 modules again on every run added
    about 0.2 CPU s to each command that no user pays."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(src)
    return env


def scenario_for_runs(scenario: str) -> str:
    """`scenario` as the runs see it from the checkout they run in (their working directory):
    a file given relative to here made absolute, a path inside the checkout kept, a library
    name as it is."""
    given = Path(scenario)
    found = str(given.absolute() if given.is_file() else ROOT / given)
    return found if Path(found).is_file() else scenario


def compile_package(src: Path) -> None:
    """Compile `src`'s package once before the runs (what the first run would do)."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(src / "testbed")],
                   env=child_env(src), check=True, stdout=subprocess.DEVNULL)  # fmt: skip


COLLECTED = re.compile(r"^==\d+== Collected : (\d+)$", re.MULTILINE)
"""callgrind's last line on stderr: the instructions it counted in all."""


def simulated_instructions(dumps: list[str]) -> float:
    """The instructions of the simulations, from callgrind's dump files (each holds the counts
    since the one before): the totals of those the child dumped as a simulation ended, or as
    one of its copies did (`--per-copy`)."""
    total = 0.0
    for text in dumps:
        if f"\ndesc: Trigger: dump {SIMULATED}\n" in f"\n{text}" or (
            f"\ndesc: Trigger: dump {per_copy.COPY}" in f"\n{text}"
        ):
            found = re.search(r"^totals: (\d+)$", text, re.MULTILINE)
            if found is None:
                raise SystemExit("a callgrind dump without its totals line")
            total += float(found.group(1))
    return total


def one_run(
    src: Path,
    argv: list[str],
    cpu: int | None,
    tmp: Path,
    instructions: bool = False,
    script: Path = ROOT / "bench/sim_speed.py",
    env: dict[str, str] | None = None,
    copies: int = 0,
) -> dict[str, Any]:
    """One child run of `testbed ARGV --out TMP/out`: `script --child SPEC` in checkout `src`,
    pinned to core `cpu`, with `env` added to its environment. The row holds the figures
    below, plus whatever else the child wrote to its result file (bench/sim_growth.py's child
    writes its cache figures there)."""
    spec = tmp / "spec.json"
    result = tmp / "result.json"
    out_dir = str(tmp / "out")
    spec.write_text(json.dumps({"argv": [*argv, "--out", out_dir], "result": str(result),
                                "copies": copies}))  # fmt: skip
    env = {**child_env(src), **(env or {})}
    valgrind: list[str] = []
    if instructions:
        env["PYTHONHASHSEED"] = "0"
        env[COUNTING] = "1"
        valgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp / 'callgrind'}"]

    def pin() -> None:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [*valgrind, sys.executable, str(script), "--child", str(spec)],
        cwd=src, env=env, stdout=subprocess.DEVNULL, preexec_fn=pin,
        stderr=subprocess.PIPE if instructions else None, text=True,
    )  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = json.loads(result.read_text()) if result.exists() else {}
    written = tmp / "out" / "summary.json"
    if not written.exists():  # no run (a failed check still writes one: its time counts)
        rc = done.returncode or out.get("rc", 1)
        said = f"; its stderr ended:\n{done.stderr[-2000:]}" if done.stderr else ""
        raise SystemExit(f"`testbed {' '.join(argv)}` exited with {rc}, no run{said}")
    summary = json.loads(written.read_text())
    row = {
        "simulate_cpu_s": out["simulate_cpu_s"],
        "command_cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "simulate_wall_s": summary["wall"]["simulate_s"],
        "requests": summary["requests"]["submitted"],
        "completed": summary["requests"]["completed"],
        "failed": summary["requests"]["failed"],
    }
    row.update({k: v for k, v in out.items() if k not in row and k != "rc"})
    if instructions:
        counted = COLLECTED.findall(done.stderr)
        if not counted:
            tail = done.stderr[-2000:]
            raise SystemExit(f"callgrind printed no count; its stderr ended:\n{tail}")
        row["instructions"] = float(counted[-1])
        # in the order callgrind wrote them: callgrind.1, .2, ..., then the final one
        files = sorted(tmp.glob("callgrind*"), key=lambda f: int(f.suffix[1:] or 1e9))
        dumps = [f.read_text() for f in files]
        row["simulate_instructions"] = simulated_instructions(dumps)
        if copies:
            row["copy_instructions"] = per_copy.copy_instructions(dumps, SIMULATED)
    return row


def label(src: Path) -> str:
    """A checkout's short commit, `+dirty` if it has changes the provenance header counts."""
    return f"{commit(src)}{'+dirty' if changed(src) else ''}"


def profile(args: argparse.Namespace, trace: Path | None, policy: str | None) -> None:
    """Profile the simulation of one run of the command, in this process."""
    import cProfile
    import pstats

    import testbed.scenario.sim_run as sim_run
    from testbed.cli import main as cli

    simulate, prof = sim_run.simulate, cProfile.Profile()
    sim_run.simulate = lambda *a, **k: prof.runcall(simulate, *a, **k)
    with tempfile.TemporaryDirectory() as out:
        cli([*cli_args(args, trace, policy), "--out", out])
    pstats.Stats(prof).sort_stats("tottime").print_stats(20)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="scenarios/paper.yaml")
    ap.add_argument("--trace", type=Path, help="a Mooncake JSONL trace to replay")
    ap.add_argument("--times", type=int, default=1, help="replay the trace N times end to end")
    ap.add_argument(
        "--per-copy", action="store_true",
        help="with --times N: also measure each copy inside its run, and the drain after the "
        "last (bench/per_copy.py)",
    )  # fmt: skip
    ap.add_argument("--policy", action="append", help="policy to run (repeatable)")
    ap.add_argument("--set", action="append", help="PATH=VALUE, as testbed run's (repeatable)")
    ap.add_argument("--duration", type=float, default=3600.0, help="seconds (x --times)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cpu", type=int, default=1, help="core to pin the runs to (-1: none)")
    ap.add_argument("--src", type=Path, action="append", help="another checkout to run too")
    ap.add_argument("--report", type=Path, help="write the figures as markdown here")
    ap.add_argument("--append", action="store_true", help="add a section to --report")
    ap.add_argument(
        "--title", help="what the section measures, after its heading's run (': TITLE'): "
        "sections of the same run then keep apart (and so do their links)"
    )  # fmt: skip
    ap.add_argument("--profile", action="store_true")
    ap.add_argument(
        "--instructions", action="store_true",
        help="also count the simulation's and each command's instructions under valgrind's "
        "callgrind (repeatable on a loaded host; about 30x slower)",
    )  # fmt: skip
    ap.add_argument(
        "--no-timeline", action="store_true", help="runs without timeline.png (testbed timeline)"
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child)
    if args.per_copy and (args.times < 2 or args.trace is None):
        ap.error("--per-copy needs --trace and --times N with N >= 2")
    cpu = None if args.cpu < 0 else args.cpu
    if args.instructions and not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        ap.error("--instructions needs valgrind and callgrind_control (Debian: valgrind)")
    srcs = [ROOT, *[s.resolve() for s in args.src or []]]
    policies = args.policy or [None]
    load_before = os.getloadavg()
    rows: dict[tuple[str, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        trace = args.trace.resolve() if args.trace else None
        if trace is not None and args.times > 1:
            trace = tiled_trace(trace, args.times, Path(tmp) / "tiled.jsonl")
        for src in srcs:
            compile_package(src)
        for i in range(args.repeat):
            for src in srcs:
                for policy in policies:
                    run_dir = Path(tempfile.mkdtemp(dir=tmp))
                    argv = cli_args(args, trace, policy)
                    r = one_run(src, argv, cpu, run_dir, args.instructions,
                                copies=args.times if args.per_copy else 0)  # fmt: skip
                    rows.setdefault((label(src), policy or "(scenario's)"), []).append(r)
                    counted = (f", {r['simulate_instructions'] / 1e9:.3f} G instructions "
                               f"simulating, {r['instructions'] / 1e9:.3f} G in all"
                               if "instructions" in r else "")  # fmt: skip
                    print(f"run {i} {label(src):>14} {policy or '':<16} "
                          f"simulate {r['simulate_cpu_s']:6.2f} CPU s, command "
                          f"{r['command_cpu_s']:6.2f} CPU s, {r['requests']:.0f} requests"
                          f"{counted} (load {os.getloadavg()[0]:.2f})", flush=True)  # fmt: skip
        table = runs_table(rows)
        if args.per_copy:
            table += "\n" + per_copy.copy_table(rows) + per_copy.NOTE
        print(table)
        head = _provenance(args, srcs, cpu, load_before)
        print(head)
        if args.report is not None:
            what = f"{Path(args.scenario).name}" + (
                f", {trace.name if args.times == 1 else f'{args.trace.name} x{args.times}'}"
                if trace is not None
                else ""
            )
            section = (
                f"## {what}, {args.duration * args.times:g} s"
                + (f": {args.title}" if args.title else "")
                + "\n\n"
                + head
                + "\n"
                + table
                + "\nCPU seconds of one process pinned to one core: `simulate` is the "
                "simulation alone (process CPU around `testbed.sim.simulate`), `command` the "
                "whole `testbed run` (start-up, imports, planning, simulation, results files). "
                "Median of the runs, [min-max] beside it.\n"
                + (
                    "Counted under callgrind (`--instructions`, PYTHONHASHSEED=0): the seconds "
                    "are valgrind's; the instructions are the simulation's (between two dumps) "
                    "and the whole command's.\n"
                    if args.instructions
                    else ""
                )
            )
            if args.append and args.report.exists():
                args.report.write_text(args.report.read_text() + "\n" + section)
            else:
                args.report.write_text("# The sim's speed (bench/sim_speed.py)\n\n" + section)
        if args.profile:
            profile(args, trace, policies[0])
    return 0


def spread(xs: list[float], fmt: str = "{:.2f}", unit: str = "") -> str:
    """`median [min-max]` of `xs` (`unit` after the median: "x" for a ratio), how the tables
    of this script and bench/sim_targets.py show a figure of several runs."""
    lo, mid, hi = (fmt.format(x) for x in (min(xs), statistics.median(xs), max(xs)))
    return f"{mid}{unit} [{lo}-{hi}]"


def pair_ratios(
    rs: list[dict[str, float]], base: list[dict[str, float]], key: str = "simulate_cpu_s"
) -> list[float]:
    """Each run's `key` over that of the `base` run of the same round (usually prfaas-static's:
    the two ran back to back, under the same load)."""
    return [r[key] / b[key] for r, b in zip(rs, base, strict=True)]


def runs_table(rows: dict[tuple[str, str], list[dict[str, float]]], first: str = "code") -> str:
    """A row per (checkout, policy): medians [min-max] of its runs; with `prfaas-static` among
    the policies, each run's simulate CPU over the static run of the same round and checkout
    (the same pair: the two ran back to back), the median of those ratios. `first` heads the
    first column (bench/sim_targets.py puts the kind of run there, not a checkout)."""
    counted = any("instructions" in r for rs in rows.values() for r in rs)
    out = (f"| {first} | policy | runs | requests | simulate, CPU s | command, CPU s "
           "| simulate / prfaas-static, same pairs |"
           + (" simulate, G instructions | command, G instructions "
              "| simulate instructions / prfaas-static |" if counted else "")
           + "\n|---|---|---|---|---|---|---|" + ("---|---|---|" if counted else "")
           + "\n")  # fmt: skip

    def fig(rs: list[dict[str, float]], key: str) -> str:
        return spread([r[key] for r in rs])

    def paired(rs: list[dict[str, float]], static: list[dict[str, float]] | None, key: str) -> str:
        if static is None or len(static) != len(rs):
            return "-"
        return spread(pair_ratios(rs, static, key), unit="x")

    def giga(rs: list[dict[str, float]], key: str) -> str:
        return spread([r[key] / 1e9 for r in rs], "{:.3f}")

    for (code, policy), rs in rows.items():
        static = rows.get((code, "prfaas-static"))
        ratio = paired(rs, static, "simulate_cpu_s")
        out += (f"| {code} | {policy} | {len(rs)} | {rs[0]['requests']:.0f} | "
                f"{fig(rs, 'simulate_cpu_s')} | {fig(rs, 'command_cpu_s')} "
                f"| {ratio} |")  # fmt: skip
        if counted:
            out += (f" {giga(rs, 'simulate_instructions')} | {giga(rs, 'instructions')} "
                    f"| {paired(rs, static, 'simulate_instructions')} |")  # fmt: skip
        out += "\n"
    return out


def _provenance(
    args: argparse.Namespace, srcs: list[Path], cpu: int | None, before: tuple[float, ...]
) -> str:
    """bench/provenance.py's header, plus the checkouts run and the core they were pinned to."""
    runs = f"{args.scenario} on the sim substrate, its seed"
    if args.trace is not None:
        runs += f", trace {args.trace.name}" + (f" x{args.times}" if args.times > 1 else "")
    head = provenance("bench/sim_speed.py", sys.argv[1:], before, runs)
    checkouts = ", ".join(f"{label(s)} ({s})" for s in srcs)
    return head + (
        f"- checkouts: {checkouts}; runs pinned to core {cpu}, one at a time, interleaved\n"
    )


if __name__ == "__main__":
    raise SystemExit(main())
