r"""An external router's scorecard exactly as a user types it, kept as a report.

    python bench/router_scorecard.py --router vllm-router --report bench/reports/scorecard.md

runs `testbed scorecard --router PRESET[:POLICY]` (live, local substrate, its default four
scenarios x the router and two baselines, one seed: ~15 min) in a child and writes what it
printed (the estimate, a line per run, the overall lines, wall and CPU), then one table from its
scorecard.json: per scenario, the requests and each row's SLO attainment, TTFT p90 and
failures. docs/scorecard.md quotes it (issue #37: the run it shows was hand-pasted before).
Section `router-PRESET-POLICY` of the report.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from provenance import TESTBED, reported  # bench/: the script's directory is on sys.path
from sample_run import run_child

from testbed.policy.decider import describe


def cell(row: dict[str, Any]) -> str:
    """One row of one scenario as the table shows it: "89.1 %, TTFT p90 10.8 s, **9 failed**"."""
    att, p90 = row.get("slo_attainment"), row.get("ttft_p90_s")
    text = "-" if att is None else f"{100 * att:.1f} %"
    text += ", TTFT p90 " + ("-" if p90 is None else f"{p90:.3g} s")
    failed = row.get("failed") or 0
    return text + (f", **{failed:g} failed**" if failed else "")


def table(card: dict[str, Any]) -> str:
    """The scorecard's rows side by side: scenario, requests (the router's runs', from the
    card's raw rows: a scenario's rows are means without a count), the router's cell, each
    baseline's."""
    labels = [card["policy"], *card["baselines"]]
    lines = [
        "| scenario | requests | " + " | ".join(describe(x) for x in labels) + " |",
        "|---" * (2 + len(labels)) + "|",
    ]
    for sc in card["scenarios"]:
        rows = sc["rows"]  # each label's mean over seeds, without the request count
        runs = [r for r in card["rows"] if r["scenario"] == sc["name"] and r["label"] == labels[0]]
        requests = sum(r["requests"] for r in runs) / len(runs) if runs else None
        cells = " | ".join(cell(rows.get(x) or {}) for x in labels)
        lines.append(f"| {sc['name']} | {'-' if requests is None else f'{requests:g}'} | {cells} |")
    return "\n".join(lines)


def measure(args: argparse.Namespace) -> int:
    """Run the scorecard in a child, print what it printed and the table; returns its exit
    status (1: a scenario not judged, kept as an outcome). A crash before scorecard.json exits
    with its status before anything is written to the report."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "scorecard"
        cmd = [*TESTBED, "scorecard", "--router", args.router, "--out", str(out)]
        status, printed = run_child(cmd)
        shown = printed.replace(str(out), "results/scorecard").rstrip()
        if status not in (0, 1) or not (out / "scorecard.json").exists():
            print(f"{shown}\ntestbed scorecard exited {status}", file=sys.stderr)
            raise SystemExit(status or 1)
        print(shown)
        print()
        print(table(json.loads((out / "scorecard.json").read_text())))
    return status


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--router", default="vllm-router", help="PRESET[:POLICY] (default vllm-router)")
    ap.add_argument("--report", type=Path, metavar="FILE", help="also write the output here")
    args = ap.parse_args()
    setup = f"local, time_scale 1; testbed scorecard --router {args.router}'s defaults, seed 1"
    name = f"router-{args.router.replace(':', '-')}"
    heading = f"An external router's scorecard: {args.router}"
    return reported(args.report, name, heading, setup, lambda: measure(args))


if __name__ == "__main__":
    raise SystemExit(main())
