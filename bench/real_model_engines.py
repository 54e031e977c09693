"""The tiny real model against the emulated engine on the same run (docs/model.md).

scenarios/real-model.yaml live twice on the local substrate: as written (`engine: torch`, real
KV, `time_scale: auto` calibrated on this host, token_exact checked), then with `engine:
emulated` at the time_scale the first run resolved to and byte_scale 1000 (the emulated engine
moves the paper's ~170 MiB of KV per request; byte_scale changes wire bytes, not real-world
times), with the same seed, workload, link and policy. What it shows: whether the two engines
route every request alike and how far apart their per-request TTFTs are, i.e. whether the
emulated engine's pacing is the real model's.

Usage: python bench/real_model_engines.py [--report FILE]
Needs torch (the `model` extra). About 8 minutes on 2 cores (two runs of 120 s real-world at the
calibrated time_scale, about 0.5 here). --report FILE writes the tables into FILE's
`real-model-engines` section (the rest of FILE is kept).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

from provenance import markdown_section  # bench/: the script's directory is on sys.path

from testbed.experiment import Grid, Run, percentile, run_scenario_once


def _line(name: str, run: Run) -> str:
    done = [r for r in run.records if r.ttft is not None]
    ttft = [r.ttft for r in done if r.ttft is not None]
    tpot = [r.tpot for r in done if r.tpot is not None]
    routes = ", ".join(f"{k} {v}" for k, v in run.summary["routes"].items())
    checks = ", ".join(f"{c.name} {c.verdict}" for c in run.checks)
    p99 = percentile(ttft, 99)
    assert p99 is not None  # the run completed requests
    cells = [
        name,
        f"{run.plan.scenario.scale.time_scale:g}",
        f"{len(done)}/{len(run.records)}",
        f"{run.summary['slo_attainment']:.1%}",
        f"{statistics.median(ttft):.3f} s",
        f"{p99:.3f} s",
        f"{statistics.median(tpot) * 1e3:.1f} ms",
        routes,
        checks,
    ]
    return "| " + " | ".join(cells) + " |"


def compare(real: Run, emulated: Run) -> str:
    """The two runs side by side, then per request: same route, and TTFT real minus emulated."""
    by_id = {r.id: r for r in emulated.records}
    pairs = [(r, by_id[r.id]) for r in real.records if r.id in by_id]
    same = sum(1 for a, b in pairs if a.route == b.route)
    diffs = [a.ttft - b.ttft for a, b in pairs if a.ttft is not None and b.ttft is not None]
    out = [
        "| engine | time_scale | completed | SLO attainment | TTFT p50 | TTFT p99 | TPOT p50 | "
        "routes | checks |",
        "|---|---|---|---|---|---|---|---|---|",
        _line("torch (real KV)", real),
        _line("emulated", emulated),
        "",
        f"Same route for {same} of {len(pairs)} requests. TTFT, torch minus emulated, per "
        f"request: median {statistics.median(diffs) * 1e3:+.1f} ms, largest in size "
        f"{max(diffs, key=abs) * 1e3:+.1f} ms, over {len(diffs)} requests with a first token "
        "in both runs.",
    ]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--report", type=Path, help="also write the table to this markdown file")
    args = ap.parse_args()
    load_before = os.getloadavg()
    print("real-model, engine: torch ...", file=sys.stderr)
    real = run_scenario_once(Grid("real-model").scenario_of(), "local")
    scale = real.plan.scenario.scale.time_scale
    emulated_grid = Grid.of(
        "real-model",
        fixed={
            "deployments.prfaas-pd.engine": "emulated",
            "scale.time_scale": scale,
            "scale.byte_scale": 1000,
            "checkers": [{"check": "failures", "max_fraction": 0}],
        },
    )
    print(f"real-model, engine: emulated at time_scale {scale:g} ...", file=sys.stderr)
    emulated = run_scenario_once(emulated_grid.scenario_of(), "local")
    text = compare(real, emulated)
    print(text)
    if args.report:
        setup = (
            "local; scenarios/real-model.yaml (seed 3) as written, then engine: emulated at the "
            "time_scale the first resolved to, byte_scale 1000, checkers: failures"
        )
        heading = "The emulated engine on the same run"
        markdown_section(args.report, "real-model-engines", heading, load_before, setup, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
