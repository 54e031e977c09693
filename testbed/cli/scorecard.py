"""`testbed scorecard --policy SPEC`: a policy against its baselines over the scenario library.

Runs every library scenario (or `--scenarios`) for the policy and each baseline with the same
seeds (testbed.scenario.scorecard) and writes scorecard.md, scorecard.json and scorecard.png to
`--out` (default results/scorecard-POLICY/); one line per finished run on stderr, the overall
line and the wall time on stdout. Exit 0, or 1 when a scenario is not judged (the policy's
fallback decided more than `--min-policy-share` allows there; a line names each), 2 for a
usage error.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Any

from testbed.checkers.policy_share import DEFAULT_MIN_SHARE
from testbed.cli.hindsight import int_list
from testbed.cli.run import add_max_requests
from testbed.metrics.scorecard import not_judged, overall_text, write_scorecard
from testbed.metrics.verdict import NOT_JUDGED
from testbed.scenario.scorecard import DEFAULT_BASELINES, SCORECARD_SUBSTRATES, run_scorecard


def _names(text: str) -> list[str]:
    values = [v.strip() for v in text.split(",") if v.strip()]
    if not values:
        raise argparse.ArgumentTypeError("an empty list")
    return values


def _run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", args.policy).strip("_") or "policy"
    out = Path(args.out) if args.out else Path("results") / f"scorecard-{slug}"

    def log(line: str) -> None:
        if not args.quiet or not line.startswith("["):
            print(line, file=sys.stderr, flush=True)

    card = run_scorecard(
        args.policy,
        baselines=args.baseline,
        substrate=args.substrate,
        scenarios=args.scenarios,
        seeds=args.seeds,
        hindsight=args.hindsight,
        jobs=args.jobs,
        out=out,
        log=log,
        cache=None if args.no_cache else Path(args.cache),
        min_policy_share=args.min_policy_share,
        max_requests=args.max_requests,
    )
    write_scorecard(card, out)
    for name, why in card["skipped"].items():
        print(f"skipped {name}: {why}")
    unjudged = not_judged(card)
    for sc in card["scenarios"]:
        if sc["name"] in unjudged:
            why = next(c["criterion"] for c in sc["against"].values() if c["verdict"] == NOT_JUDGED)
            print(f"{sc['name']}: {why}")
    print(overall_text(card))
    print(
        f"results: {out}/ (scorecard.md, scorecard.json, scorecard.png); "
        f"{len(card['scenarios'])} scenarios, {card['runs']} runs "
        f"({card['cached_runs']} from the cache), "
        f"{time.perf_counter() - started:.1f}s wall, {card['cpu_s']:.1f}s CPU"
    )
    return 1 if unjudged else 0


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "scorecard",
        help="score a routing policy against baselines over the whole scenario library",
        description="Run every library scenario (or --scenarios) for the policy and each "
        "baseline with the same seeds, and write scorecard.md, scorecard.json and "
        "scorecard.png: per scenario checker verdicts, goodput at the SLO, SLO attainment, "
        "TTFT p50/p90/p99, failures and cross-DC bytes against the baselines, the best fixed "
        "threshold in hindsight (sim), and one overall line.",
    )
    p.add_argument(
        "--policy",
        required=True,
        metavar="SPEC",
        help="what `testbed run --policy` takes: a built-in name, module:Class, an entry point",
    )
    p.add_argument(
        "--baseline",
        type=_names,
        default=list(DEFAULT_BASELINES),
        metavar="LIST",
        help=f"policies to compare against (default {','.join(DEFAULT_BASELINES)})",
    )
    p.add_argument("--substrate", default="sim", choices=list(SCORECARD_SUBSTRATES))
    p.add_argument(
        "--scenarios", type=_names, metavar="LIST", help="library names or files (default: all)"
    )
    p.add_argument(
        "--seeds", type=int_list, default=[1, 2, 3], metavar="LIST", help="default 1,2,3"
    )
    p.add_argument(
        "--hindsight",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="add the best fixed threshold in hindsight as a reference row (default: on for sim)",
    )
    p.add_argument("--out", metavar="DIR", help="output directory (default results/scorecard-SPEC)")
    p.add_argument(
        "--jobs", type=int, metavar="N", help="local processes on the sim (default: cores)"
    )
    p.add_argument(
        "--cache",
        default="results/.scorecard-cache",
        metavar="DIR",
        help="where sim runs of built-in policies on library scenarios are kept and reused by "
        "the same testbed (default results/.scorecard-cache)",
    )
    p.add_argument("--no-cache", action="store_true", help="run everything, keep nothing")
    p.add_argument(
        "--min-policy-share",
        type=float,
        default=DEFAULT_MIN_SHARE,
        metavar="FRACTION",
        help="a scenario where the policy decided less of the routes itself (its fallback the "
        f"rest) is not judged, and the command exits 1 (default {DEFAULT_MIN_SHARE:g})",
    )
    p.add_argument("--quiet", action="store_true", help="no line per finished run")
    add_max_requests(p)
    p.set_defaults(func=_run)
