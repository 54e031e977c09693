"""How many of an HTTP policy's answers come late on this host: the full burst, live, N times.

Each run is `testbed run burst --policy URL#timeout=50ms&fallback=prfaas-nolongterm` against the
example service (examples/least-ttft, started on a free loopback port for the runs, as
bench/sample_run.py's `--serve` does), with the scenario's checkers, the same seed every time:
the workload and the decisions asked are the same, so what differs between runs is the host,
and the table gives each run's 1-minute load average before it beside its late answers. A
fallback is `late` when the answer was not in by the timeout (real-world wall, time_scale 10),
`queued` when the decision waited behind others; burst's `policy_share` checker fails a run
whose policy decided less than 99% of the routes.

Usage: python bench/policy_late.py [--runs 4] [--timeout 50ms] [--report FILE]
About 40 s a run on 2 cores. --report FILE writes the table into FILE's `policy-late` section
(the rest of FILE is kept).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from provenance import load_text, markdown_section  # bench/: on sys.path
from sample_run import served

from testbed.experiment import Grid, Run, run_scenario_once

FALLBACK = "prfaas-nolongterm"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} ms"


def row(i: int, load: tuple[float, ...], run: Run) -> str:
    d: dict[str, Any] = run.summary["decisions"]
    reasons = d["fallback_reasons"]
    why = ", ".join(f"{v} {k}" for k, v in reasons.items()) or "-"
    share = next((c.verdict for c in run.checks if c.name == "policy_share"), "-")
    lag = (d.get("loop_lag_ms") or {}).get("p99")
    return (
        f"| {i} | {load[0]:.2f} | {d['by']['policy']} of {d['routed']} | {why} | "
        f"{_ms(d['latency_wall_ms']['p99'])} | {_ms(d['answer_wall_ms']['p99'])} | "
        f"{_ms(d['answer_wall_ms']['max'])} | {_ms(lag)} | {share} |"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--timeout", default="50ms", help="the policy URL's timeout")
    ap.add_argument("--report", type=Path, help="also write the table to this markdown file")
    args = ap.parse_args()
    load_before = os.getloadavg()
    scenario = Grid("burst").scenario_of()
    out = [
        "| run | load before (1 min) | by the policy | fallbacks | ask-to-route p99 | "
        "send-to-answer p99 | send-to-answer max | loop lag p99 | policy_share |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    with served("least-ttft") as url:
        spec = f"{url}#timeout={args.timeout}&fallback={FALLBACK}"
        for i in range(1, args.runs + 1):
            load = os.getloadavg()
            print(f"run {i}/{args.runs} (load {load_text(load)}) ...", file=sys.stderr)
            out.append(row(i, load, run_scenario_once(scenario, "local", policy=spec)))
    text = "\n".join(out)
    print(text)
    if args.report:
        setup = (
            f"local; scenarios/burst.yaml, the scenario's seed, {args.runs} runs; --policy "
            f"'{{url}}#timeout={args.timeout}&fallback={FALLBACK}', {{url}} examples/least-ttft"
        )
        heading = f"Late answers over {args.runs} runs of the full burst"
        markdown_section(args.report, "policy-late", heading, load_before, setup, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
