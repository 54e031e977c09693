r"""What the commands the docs give as guidance cost here: the durations docs/running.md,
docs/scenarios.md, docs/tests.md, docs/scorecard.md, docs/sim.md and
docs/validate-your-scheduler.md quote, measured by the commands themselves (issue #37: no
hand-recorded figure).

    python bench/durations.py --report bench/reports/durations.md        # all sections, ~35 min
    python bench/durations.py --sections library --report bench/reports/durations.md

Sections (each its own part of the report, with its provenance header):

- `library`: every library scenario as `make scenario NAME=...` runs it (`testbed run NAME`,
  local processes; wall seconds and the exit status) and as `make scenario SUBSTRATE=sim` does
  (child CPU seconds), and `paper` on its two other deployments (`--policy homogeneous`,
  `naive`) with its throughput checker's line. real-model needs torch (the `model` extra).
- `short`: every library scenario's short version (`testbed.scenario.short.short_variant`, what
  the chaos suite and `testbed scorecard --substrate local` run), live, in this process as the
  chaos harness runs it: start-up (to the first arrival), the run, the stop; and the CPU of
  drawing timeline.png for one of them.
- `tests`: `pytest -m chaos` (`make chaos`) with a JUnit report, per file: tests and seconds;
  the sim leg (tests/chaos/test_sim_leg.py) with and without `--cov=testbed`.
- `scorecard`: `testbed scorecard` with its defaults (three seeds, both baselines, the hindsight
  rows; no cache) for the example plugin policy, and `bench/sim_vs_live.py --all --sim-only`.

Live, so exempt from the smoke tests (tests/bench/test_smoke.py). Every figure is wall time on
this machine with whatever else runs: the header gives the load average before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from pathlib import Path

from provenance import TESTBED, markdown_section, measured_child  # bench/ is on sys.path

from testbed.scenario.library import library_scenarios
from testbed.scenario.plan import Progress, RunOptions, prepare_run
from testbed.scenario.schema import load_scenario
from testbed.scenario.short import short_variant

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("library", "short", "tests", "scorecard")
"""The names `--sections` takes; NAME_section measures each, its docstring's first line the
section's heading in the report."""
TORCH_MISSING = "torch is not installed (the `model` extra)"


def has_torch() -> bool:
    """Whether the tiny real model can run here (real-model's scenario needs it)."""
    return importlib.util.find_spec("torch") is not None


def needs_torch(path: Path) -> bool:
    """Whether the scenario runs the tiny real model (`engine: torch`)."""
    return any(d.engine == "torch" for d in load_scenario(path).deployments.values())


def status_text(code: int) -> str:
    """`testbed run`'s exit status in words (0: checkers passed; 1: a checker failed)."""
    return {0: "passed", 1: "a checker failed"}.get(code, f"error (exit {code})")


def throughput_line(out: Path) -> str:
    """The throughput checker's detail from a run's summary.json (paper's own checker)."""
    checks = json.loads((out / "summary.json").read_text())["checks"]
    return next((c["detail"] for c in checks if c["name"].startswith("throughput")), "-")


def library_section(log: Callable[[str], None]) -> str:
    """The library, as `make scenario` runs it

    Every library scenario live and on the sim, and paper on its three deployments."""
    torch_ok = has_torch()
    rows = ["| scenario | live: wall s | live: checkers | sim: CPU s | sim: wall s |",
            "|---|---|---|---|---|"]  # fmt: skip
    lives: list[float] = []
    sims: list[float] = []
    for path in library_scenarios():
        name, torch = path.stem, needs_torch(path)
        if torch and not torch_ok:
            rows.append(f"| {name} | - | {TORCH_MISSING} | - | - |")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            code, wall, _, _ = measured_child([*TESTBED, "run", name, "--out", f"{tmp}/live"])
            live = f"{wall:.1f} | {status_text(code)}"
            lives.append(wall)
            if torch:
                sim = "- | - (the sim runs no real model)"
            else:
                scode, swall, scpu, _ = measured_child(
                    [*TESTBED, "run", name, "--substrate", "sim", "--out", f"{tmp}/sim"]
                )
                sim = f"{scpu:.1f} | {swall:.1f}" + (
                    "" if scode == 0 else f" ({status_text(scode)})"
                )
                sims.append(scpu)
        rows.append(f"| {name} | {live} | {sim} |")
        log(rows[-1])
    text = "\n".join(rows) + "\n"
    if lives:
        text += (
            f"\nLive: {min(lives):.0f}-{max(lives):.0f} s of wall time a scenario "
            f"(median {statistics.median(lives):.0f} s). Sim: {min(sims):.1f}-{max(sims):.1f} "
            "CPU s a scenario, the whole command (interpreter start, plan, simulate, results, "
            "timeline).\n"
        )
    paper = ["", "paper on its three deployments, live (its throughput checker's line):", "",
             "| policy | wall s | throughput in 40-120 s |", "|---|---|---|"]  # fmt: skip
    for policy in (None, "homogeneous", "naive"):
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [*TESTBED, "run", "paper", "--out", tmp]
            code, wall, _, out = measured_child([*cmd, "--policy", policy] if policy else cmd)
            if (Path(tmp) / "summary.json").exists():
                line = throughput_line(Path(tmp))
            else:  # the run did not get to its results: say how it ended
                line = f"{status_text(code)}: {(out.strip().splitlines() or [''])[-1]}"
        paper.append(f"| {policy or '(its own: prfaas)'} | {wall:.1f} | {line} |")
        log(paper[-1])
    return text + "\n".join(paper) + "\n"


PHASES = ("running", "draining", "stopping", "results")
"""The marks a short run is timed by, after its start: the first arrival, the last one due, the
services' stop begun, the results phase (the services stopped)."""


def timed_short_run(path: Path, draw: bool) -> tuple[list[float], float | None]:
    """The short version of scenario `path`, live, as the chaos harness runs it: the times of
    its start, its PHASES and its end (perf_counter), and with `draw` the CPU seconds of
    drawing its timeline.png afterwards (the chaos suite skips it)."""
    from testbed.metrics.timeline import draw_run
    from testbed.scenario.runner import _Run, run_scenario

    marks: dict[str, float] = {}

    class TimedRun(_Run):
        """The runner's run, the start of its services' stop marked."""

        async def shutdown(self) -> None:
            marks.setdefault("stopping", time.perf_counter())
            await super().shutdown()

    def mark(p: Progress) -> None:
        marks.setdefault(p.phase, time.perf_counter())

    sc = short_variant(load_scenario(path))
    with tempfile.TemporaryDirectory() as tmp:
        opts = RunOptions(out_dir=Path(tmp), progress=False, drain_timeout_s=60, timeline=False)
        t0 = time.perf_counter()
        result = asyncio.run(run_scenario(prepare_run(sc, opts), opts, mark, TimedRun))
        end = time.perf_counter()
        drawn = None
        if draw:
            c0 = time.process_time()
            draw_run(Path(tmp), result.records, result.history, result.summary)
            drawn = time.process_time() - c0
    return [t0, *(marks[k] for k in PHASES), end], drawn


def short_section(log: Callable[[str], None]) -> str:
    """The short versions, live (the chaos suite's runs)

    Each library scenario's short version, timed by phase as the chaos suite runs it."""
    torch_ok = has_torch()
    rows = ["| scenario | start-up s | arrivals s | drain s | stop s | results s | total s |",
            "|---|---|---|---|---|---|---|"]  # fmt: skip
    totals: list[float] = []
    stops: list[float] = []
    drawn = ""
    for path in library_scenarios():
        if needs_torch(path) and not torch_ok:
            rows.append(f"| {path.stem} | {TORCH_MISSING} | | | | | |")
            continue
        at, draw_cpu = timed_short_run(path, draw=not drawn)
        if draw_cpu is not None:
            drawn = f"{path.stem}: {draw_cpu:.2f} CPU s"
        phases = " | ".join(f"{b - a:.1f}" for a, b in itertools.pairwise(at))
        rows.append(f"| {path.stem} | {phases} | {at[-1] - at[0]:.1f} |")
        totals.append(at[-1] - at[0])
        stops.append(at[4] - at[3])
        log(rows[-1])
    text = "\n".join(rows) + "\n"
    text += (
        "\nStart-up: the call to the first arrival (planning, the zygote forking every service, "
        "each ready); arrivals: to the last one due; drain: to the last request's end; stop: "
        "the services stopped; results: the run's files written (timeline.png not drawn, as in "
        f"the chaos suite). Total {min(totals):.0f}-{max(totals):.0f} s a run (median "
        f"{statistics.median(totals):.0f} s); stop {min(stops):.2f}-{max(stops):.2f} s.\n"
        f"\nDrawing timeline.png (testbed.metrics.timeline.draw_run) for {drawn}.\n"
    )
    return text


def junit_rows(xml: Path) -> tuple[list[str], int, float]:
    """Per test file in a JUnit report: tests and seconds (min / median / max a test, total),
    the rows of a markdown table, with the tests and seconds over all."""
    by_file: dict[str, list[float]] = {}
    for case in ET.parse(xml).iter("testcase"):
        name = case.get("classname", "").split(".")
        file = "/".join(part for part in name if not part[:1].isupper()) + ".py"
        by_file.setdefault(file, []).append(float(case.get("time", "0")))
    rows = ["| file | tests | s a test (min / median / max) | total s |", "|---|---|---|---|"]
    for file, times in sorted(by_file.items(), key=lambda kv: -sum(kv[1])):
        rows.append(
            f"| {file} | {len(times)} | {min(times):.1f} / {statistics.median(times):.1f} / "
            f"{max(times):.1f} | {sum(times):.0f} |"
        )
    every = [t for times in by_file.values() for t in times]
    return rows, len(every), sum(every)


def tests_section(log: Callable[[str], None]) -> str:
    """The chaos suite and the sim leg

    `make chaos` by file, and the sim leg with and without coverage."""
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "chaos.xml"
        code, wall, _, out = measured_child([*pytest, "-m", "chaos", f"--junitxml={xml}"])
        rows, count, seconds = junit_rows(xml)
    last = out.strip().splitlines()[-1] if out.strip() else ""
    text = (
        f"`pytest -m chaos` (what `make chaos` runs): {wall:.0f} s of wall time, exit {code} "
        f"(`{last}`); {count} tests, {seconds:.0f} s in the tests themselves:\n\n"
        + "\n".join(rows) + "\n"
    )  # fmt: skip
    log(text)
    start = len(text)
    leg = "tests/chaos/test_sim_leg.py"
    _, plain_wall, plain_cpu, _ = measured_child([*pytest, leg])
    _, cov_wall, cov_cpu, _ = measured_child([*pytest, leg, "--cov=testbed", "--cov-report="])
    text += (
        f"\nThe sim leg alone (`pytest {leg}`): {plain_wall:.0f} s wall, {plain_cpu:.0f} CPU s; "
        f"with `--cov=testbed`: {cov_wall:.0f} s wall, {cov_cpu:.0f} CPU s "
        f"({cov_cpu / plain_cpu:.1f}x the CPU).\n"
    )
    log(text[start:])
    return text


EXAMPLE_POLICY = "least_ttft.plugin:LeastTTFT"
"""The example plugin policy, by module and class: what the `least-ttft` entry point names,
importable from examples/least-ttft without installing it."""


def scorecard_section(log: Callable[[str], None]) -> str:
    """The scorecard's defaults and the agreement bench's sim leg

    `testbed scorecard`'s defaults for the example policy, and sim_vs_live's sim leg."""
    env = {"PYTHONPATH": str(ROOT / "examples" / "least-ttft")}
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [*TESTBED, "scorecard", "--policy", EXAMPLE_POLICY, "--no-cache", "--quiet",
               "--out", tmp]  # fmt: skip
        code, wall, cpu, out = measured_child(cmd, env)
    tail = [line for line in out.splitlines() if line.startswith(("overall", "..."))]
    lines.append(
        f"`testbed scorecard --policy {EXAMPLE_POLICY} --no-cache` (three seeds, both baselines, "
        f"the hindsight rows; sim, one process per core): {wall:.0f} s wall, {cpu:.0f} CPU s, "
        f"exit {code}; its last lines:\n\n```\n" + "\n".join(tail) + "\n```"
    )
    log(lines[-1])
    code, wall, cpu, _ = measured_child(
        [sys.executable, "bench/sim_vs_live.py", "--all", "--sim-only"]
    )
    lines.append(
        f"`python bench/sim_vs_live.py --all --sim-only` (six scenarios, three seeds, the sim): "
        f"{wall:.0f} s wall, {cpu:.0f} CPU s, exit {code}."
    )
    log(lines[-1])
    return "\n\n".join(lines) + "\n"


MEASURES: dict[str, Callable[[Callable[[str], None]], str]] = {
    name: globals()[f"{name}_section"] for name in SECTIONS
}
"""Each section's measure: NAME_section, which logs its rows as they come and returns its text."""


def parse_sections(text: str) -> list[str]:
    """`--sections`: a comma-separated subset of SECTIONS."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = sorted(set(names) - set(SECTIONS))
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown section(s) {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(SECTIONS)}"
        )
    return names


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--sections", type=parse_sections, default=list(SECTIONS),
                    help=f"comma-separated, from {','.join(SECTIONS)} (default: all)")  # fmt: skip
    ap.add_argument("--report", type=Path, help="write each section into this markdown report")
    args = ap.parse_args(argv)
    if args.report is not None and not args.report.exists():
        args.report.write_text("# Durations: what the docs' guidance commands cost here\n")
    for name in args.sections:
        measure = MEASURES[name]
        heading = (measure.__doc__ or name).splitlines()[0]
        print(f"## {heading}", flush=True)
        load_before = os.getloadavg()
        text = measure(lambda line: print(line, flush=True))
        if args.report is not None:
            setup = "local processes (live) and the sim, each scenario's own seed; wall seconds"
            markdown_section(args.report, f"durations-{name}", heading, load_before, setup, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
