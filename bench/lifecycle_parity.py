"""Does a change to the run lifecycle leave runs as they were? Two checkouts, the same scenarios.

Issue #34 rebuilt how a run is put together (one dispatch core for the live router and the sim,
substrates as registry entries, faults through link verbs) and promised behaviour unchanged:

- sim: every library scenario the sim accepts, at its default seed, gives a byte-identical
  requests.jsonl on both checkouts (a deterministic run: any difference is a change);
- live (`--live`): the short prefill-crash, decode-crash and partition runs on local processes
  give the same retries and failure reasons, joined by request id, and the same checker
  verdicts. A live run is not deterministic (which request is in flight when the kill lands
  moves with the machine's timing), so the before checkout runs twice and its own difference
  is the noise floor the after run is read against.

    python bench/lifecycle_parity.py --before /tmp/wt-before [--after .] [--live]
        [--report bench/reports/lifecycle_parity.md]

`--before`/`--after` are checkouts of the project (e.g. `git worktree add /tmp/wt-before REV`),
run with their directory on PYTHONPATH; the venv is this one's.

Unlike the other bench scripts, the runs do not go through `testbed.experiment`: what is
compared is what each checkout's own `testbed run` writes (its planning, its run path, its
requests.jsonl writer), and `testbed.experiment` would run this checkout's code for both. The
scenarios are this checkout's library (testbed.scenario.library.library_scenarios).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from provenance import provenance  # bench/provenance.py: the script's directory is on sys.path

from testbed.scenario.library import library_scenarios

ROOT = Path(__file__).resolve().parents[1]
LIVE = ("prefill-crash", "decode-crash", "partition")
REFUSED = 2
"""`testbed run`'s exit code for a scenario the substrate refuses (e.g. real-model on the sim)."""


def _run(src: Path, name: str, out: Path, substrate: str) -> int:
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [sys.executable, "-m", "testbed.cli", "run", name, "--substrate", substrate]
    cmd += ["--quiet", "--no-timeline", "--out", str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    (out.parent / f"{out.name}.log").write_text(done.stdout + done.stderr)
    return done.returncode


def sim_rows(before: Path, after: Path, work: Path) -> list[str]:
    rows = []
    for name in (p.stem for p in library_scenarios()):
        a, b = work / "before" / name, work / "after" / name
        a.parent.mkdir(parents=True, exist_ok=True)
        b.parent.mkdir(parents=True, exist_ok=True)
        ca, cb = _run(before, name, a, "sim"), _run(after, name, b, "sim")
        if REFUSED in (ca, cb):
            rows.append(f"| {name} | refused (exit {ca} / {cb}) | - | - |")
            continue
        ra, rb = (p / "requests.jsonl" for p in (a, b))
        n = sum(1 for _ in ra.open())
        same = ra.read_bytes() == rb.read_bytes()
        print(f"sim {name}: {n} requests, {'identical' if same else 'DIFFERENT'}", flush=True)
        rows.append(f"| {name} | {n} | {ca} / {cb} | {'yes' if same else '**no**'} |")
    return rows


def _records(run: Path) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in map(json.loads, (run / "requests.jsonl").open())}


def _verdicts(run: Path) -> list[str]:
    log = (run.parent / f"{run.name}.log").read_text().splitlines()
    return [line.split(" - ")[0] for line in log if line.startswith("check ")]


def _outcome(r: dict[str, Any]) -> tuple[int, str | None]:
    return int(r.get("retries") or 0), r.get("failure_reason")


def _compare(a: Path, b: Path) -> tuple[int, int, int, int, int, bool]:
    """(requests, retries a, retries b, failed a, ids whose retries or reason differ, verdicts
    equal)"""
    ra, rb = _records(a), _records(b)
    differ = sum(1 for i in ra if i in rb and _outcome(ra[i]) != _outcome(rb[i]))
    retries = [sum(_outcome(r)[0] for r in x.values()) for x in (ra, rb)]
    failed = sum(r["status"] == "failed" for r in rb.values())
    return len(ra), retries[0], retries[1], failed, differ, _verdicts(a) == _verdicts(b)


def live_rows(before: Path, after: Path, work: Path) -> list[str]:
    rows = []
    for name in LIVE:
        runs = {}
        for label, src in (("before", before), ("after", after), ("before-again", before)):
            out = work / label / name
            out.parent.mkdir(parents=True, exist_ok=True)
            code = _run(src, name, out, "local")
            print(f"live {name} {label}: exit {code}", flush=True)
            runs[label] = out
        n, r0, r1, failed, differ, same = _compare(runs["before"], runs["after"])
        _, _, r2, _, floor, same2 = _compare(runs["before"], runs["before-again"])
        verdicts = ", ".join(v.removeprefix("check ") for v in _verdicts(runs["after"]))
        rows.append(
            f"| {name} | {n} | {r0} / {r1} / {r2} | {failed} | {differ} | {floor} | "
            f"{'same' if same else '**differ**'}{'' if same2 else ' (before runs differ too)'}"
            f" | {verdicts} |"
        )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="checkout to compare against")
    ap.add_argument("--after", type=Path, default=ROOT, help="checkout under test (this one)")
    ap.add_argument("--live", action="store_true", help="also the three live fault runs")
    ap.add_argument("--report", type=Path, help="write the tables as markdown here")
    args = ap.parse_args()
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="parity-") as tmp:
        work = Path(tmp)
        sim = sim_rows(args.before.resolve(), args.after.resolve(), work / "sim")
        live = (
            live_rows(args.before.resolve(), args.after.resolve(), work / "live")
            if args.live
            else []
        )
    text = "# Run lifecycle parity: two checkouts, the same runs (bench/lifecycle_parity.py)\n\n"
    setup = "sim (library scenarios, default seeds); local processes for --live"
    text += provenance("bench/lifecycle_parity.py", sys.argv[1:], load, setup)
    text += "\n## Sim: requests.jsonl byte for byte\n\n"
    text += "| scenario | requests | exit before / after | identical |\n|---|---|---|---|\n"
    text += "\n".join(sim) + "\n"
    if live:
        text += (
            "\n## Live fault runs: retries and failure reasons by request id\n\n"
            "Retries are summed over the run's requests, before / after / before again. "
            "'ids differing' counts requests whose (retries, failure reason) differ between "
            "before and after; 'noise floor' the same count between the two before runs.\n\n"
            "| scenario | requests | retries | failed after | ids differing | noise floor "
            "| verdicts | checks after |\n|---|---|---|---|---|---|---|---|\n"
        )
        text += "\n".join(live) + "\n"
    print(text)
    if args.report:
        args.report.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
