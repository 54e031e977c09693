"""Where the sim's time grows faster than its trace: the prefix cache's share at x1 and xN.

Issue #35 asks that N copies of the shared trace cost at most 10.5x one copy. This script
splits the simulation's time into what the prefix cache takes (testbed/kvcache: the manager,
the pools and the chain keys, entered from outside; nested calls count once) and the rest,
at one copy and at `--times` copies, and counts the cache's work: the entries the pools took
in (blocks and linear-attention states, evicted or not) and the entries they hold at the end.
If the cache does N times the work of one copy but takes more than N times the seconds, the
growth is the cost of each operation, not their number. A probe then times a membership test
in an OrderedDict of 16-byte keys (the pools' block table) at the sizes the largest pool
reached, random keys, equal but not identical objects, as a lookup by another request's
chain keys is.

    python bench/sim_growth.py --trace ../shared/traces/mooncake_synthetic_trace.jsonl \\
        [--times 10] [--policy prfaas ...] [--repeat 3] [--report bench/reports/sim_growth.md]

Each `--times N` writes its own section of the report (`growth-xN`), so x10 and x20 sit side
by side: whether the growth past 10x goes on or stops once the pools are full.

Each run is one child process pinned to one core (`--cpu`), as bench/sim_speed.py runs it;
the simulation is timed in process CPU seconds, the cache by `time.perf_counter_ns` around
each call (wall time of a pinned, CPU-bound process). The timers add about 0.2 us a call,
0.04 s over the 161K calls of ten copies, to the simulation's seconds; most of it falls outside
the timed interval, in the rest.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import statistics
import struct
import tempfile
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import sim_speed
from provenance import markdown_section  # bench/ is on sys.path
from sim_speed import (
    ROOT,
    add_trace_options,
    compile_package,
    run_argv,
    scenario_for_runs,
    tiled_trace,
    timed_simulate,
)

WRAPPED = {
    "testbed.kvcache.manager:KVCacheManager": ("lookup", "insert", "record_prefill"),
    "testbed.kvcache.pool:HybridPrefixPool": (
        "match_blocks", "lookup", "match", "payloads", "insert", "reserve_transfer",
        "release_transfer",
    ),
    "testbed.kvcache.pool:ChainKeys": ("__init__", "leading", "first"),
}  # fmt: skip
"""The prefix cache's entry points timed in the child (outermost call only): the work of a
simulation, not the counters the summary reads afterwards (`stats`)."""


def child(spec_path: str) -> int:
    """Run the command in this process with the simulation and the prefix cache timed."""
    import importlib

    spec = json.loads(Path(spec_path).read_text())
    clock, depth, spent, calls = time.perf_counter_ns, [0], [0], [0]

    def timed(f: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if depth[0]:
                return f(*args, **kwargs)
            depth[0] = 1
            t0 = clock()
            try:
                return f(*args, **kwargs)
            finally:
                spent[0] += clock() - t0
                calls[0] += 1
                depth[0] = 0

        return call

    for where, names in WRAPPED.items():
        module, cls = where.split(":")
        klass = getattr(importlib.import_module(module), cls)
        for name in names:
            setattr(klass, name, timed(getattr(klass, name)))
    from testbed.kvcache.pool import HybridPrefixPool

    pools: list[HybridPrefixPool] = []
    init = HybridPrefixPool.__init__

    def register(self: HybridPrefixPool, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        pools.append(self)

    HybridPrefixPool.__init__ = register  # type: ignore[method-assign]
    cpu, _ = timed_simulate()
    from testbed.cli import main as cli

    rc = cli(spec["argv"])
    held = [p.stats() for p in pools]
    result = {
        "rc": rc,
        "simulate_cpu_s": sum(cpu),
        "cache_s": spent[0] / 1e9,
        "cache_calls": calls[0],
        "held": [s.blocks + s.states for s in held],
        "added": sum(s.blocks + s.states + s.evictions for s in held),
        "evictions": sum(s.evictions for s in held),
    }
    Path(spec["result"]).write_text(json.dumps(result))
    return 0


def one_run(args: argparse.Namespace, trace: Path, times: int, policy: str) -> dict[str, Any]:
    """One child run of `testbed run` on `times` copies of the trace under `policy`
    (bench/sim_speed.py's `one_run`, with this script's child)."""
    argv = run_argv(args.run_scenario, args.duration * times, trace, policy, args.set)
    with tempfile.TemporaryDirectory() as d:
        cpu = args.cpu if args.cpu >= 0 else None
        return sim_speed.one_run(ROOT, argv, cpu, Path(d), script=Path(__file__).resolve())


def probe_ns(entries: int, probes: int = 100_000, rounds: int = 5) -> float:
    """ns per membership test in an OrderedDict of `entries` 16-byte keys (best of `rounds`)."""
    pack = struct.Struct("<q").pack
    keys = [hashlib.blake2b(pack(i), digest_size=16).digest() for i in range(entries)]
    table = OrderedDict.fromkeys(keys)
    rng = random.Random(entries)
    asked = [bytes(bytearray(k)) for k in rng.choices(keys, k=probes)]  # equal, not identical
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for k in asked:
            k in table  # noqa: B015 - the membership test is what is timed
        best = min(best, (time.perf_counter_ns() - t0) / probes)
    return best


def table(runs: dict[tuple[str, int], list[dict[str, Any]]], times: int) -> str:
    """The medians per policy and copies, then each policy's xN / x1 growth."""
    med = {k: {f: statistics.median(r[f] for r in rs) for f in ("simulate_cpu_s", "cache_s",
               "added", "evictions", "cache_calls")} for k, rs in runs.items()}  # fmt: skip
    out = ["| policy | copies | requests completed | simulate, CPU s | prefix cache, s | rest, s "
           "| cache calls | entries taken in | evictions | largest pool at the end |",
           "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for (policy, n), m in med.items():
        first = runs[(policy, n)][0]
        held, done = max(first["held"]), f"{first['completed']:,} of {first['requests']:,}"
        out.append(f"| {policy} | x{n} | {done} | {m['simulate_cpu_s']:.2f} | {m['cache_s']:.2f} | "
                   f"{m['simulate_cpu_s'] - m['cache_s']:.2f} | {m['cache_calls']:,.0f} | "
                   f"{m['added']:,.0f} | {m['evictions']:,.0f} | {held:,} |")  # fmt: skip
    out += ["", f"| policy | simulate x{times} / x1 | prefix cache | rest | entries taken in |",
            "|---|---|---|---|---|"]  # fmt: skip
    for policy in dict.fromkeys(p for p, _ in med):
        a, b = med[(policy, 1)], med[(policy, times)]
        rest = (b["simulate_cpu_s"] - b["cache_s"]) / (a["simulate_cpu_s"] - a["cache_s"])
        out.append(f"| {policy} | {b['simulate_cpu_s'] / a['simulate_cpu_s']:.2f}x | "
                   f"{b['cache_s'] / a['cache_s']:.2f}x | {rest:.2f}x | "
                   f"{b['added'] / a['added']:.2f}x |")  # fmt: skip
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_trace_options(ap, "policy to run (repeatable)")
    ap.add_argument("--times", type=int, default=10, help="copies of the trace (>= 2)")
    args = ap.parse_args()
    if args.child:
        return child(args.child)
    if args.times < 2 or args.repeat < 1:
        ap.error("--times must be at least 2 and --repeat at least 1")
    if args.trace is None or not args.trace.is_file():
        ap.error(f"--trace {args.trace}: no such file")
    args.run_scenario = scenario_for_runs(args.scenario)
    policies = args.policy or ["prfaas-static", "prfaas", "prfaas-predict"]
    load_before = os.getloadavg()
    compile_package(ROOT)
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as d:
        traces = {n: tiled_trace(args.trace, n, Path(d) / f"x{n}.jsonl") for n in (1, args.times)}
        for r in range(args.repeat):
            for policy in policies:
                for n, trace in traces.items():
                    row = one_run(args, trace, n, policy)
                    runs.setdefault((policy, n), []).append(row)
                    sim, cache = row["simulate_cpu_s"], row["cache_s"]
                    print(f"run {r} {policy:16} x{n:<3} simulate {sim:6.2f} CPU s, "
                          f"prefix cache {cache:5.2f} s", flush=True)  # fmt: skip
    text = table(runs, args.times)
    sizes = sorted({max(rs[0]["held"]) for rs in runs.values()})
    text += "\n| OrderedDict of 16-byte keys, entries | ns per membership test (random) |\n"
    text += "|---|---|\n" + "".join(f"| {s:,} | {probe_ns(s):.0f} |\n" for s in sizes)
    print(text)
    if args.report is not None:
        if not args.report.exists():
            title = __doc__.splitlines()[0].rstrip(".")
            args.report.write_text(f"# {title} (bench/sim_growth.py)\n")
        setup = (f"{args.scenario} on the sim substrate, its seed, trace {args.trace.name} "
                 f"x1 and x{args.times}; medians of {args.repeat} runs pinned to core "
                 f"{args.cpu}")  # fmt: skip
        n = args.times
        markdown_section(args.report, f"growth-x{n}", f"The prefix cache at x1 and x{n}",
                         load_before, setup, text)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
