"""`testbed scorecard --policy SPEC`: a policy against its baselines over the scenario library;
`testbed scorecard --router PRESET[:POLICY]`: an external router against our policies.

Runs every library scenario (or `--scenarios`) for the policy and each baseline with the same
seeds (testbed.scenario.scorecard) and writes scorecard.md, scorecard.json and scorecard.png to
`--out` (default results/scorecard-POLICY/); one line per finished run on stderr, the overall
line and the wall time on stdout. With `--router` instead of `--policy`, the router is the row
under test, live on the local substrate at time_scale 1 over at most four scenarios by default
(testbed.scenario.scorecard_router), the expected wall time printed before the first run.
Exit 0, or 1 when a scenario is not judged (the policy's fallback decided more than
`--min-policy-share` allows there; a line names each), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed.checkers.policy_share import DEFAULT_MIN_SHARE
from testbed.cli.hindsight import int_list
from testbed.cli.run import _positive_duration, add_max_requests
from testbed.errors import UserError
from testbed.metrics.scorecard import not_judged, overall_text, write_scorecard
from testbed.metrics.verdict import NOT_JUDGED
from testbed.scenario.scorecard import DEFAULT_BASELINES, SCORECARD_SUBSTRATES, run_scorecard
from testbed.scenario.scorecard_router import (
    DEFAULT_DURATION_S,
    ROUTER_BASELINES,
    ROUTER_SCENARIOS,
    run_router_scorecard,
)


def _names(text: str) -> list[str]:
    values = [v.strip() for v in text.split(",") if v.strip()]
    if not values:
        raise argparse.ArgumentTypeError("an empty list")
    return values


def _run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    what = args.router or args.policy
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", what).strip("_") or "policy"
    out = Path(args.out) if args.out else Path("results") / f"scorecard-{slug}"

    def log(line: str) -> None:
        if not args.quiet or not line.startswith("["):
            print(line, file=sys.stderr, flush=True)

    if args.router:
        card = _router_card(args, out, log)
    else:
        if args.duration is not None:
            raise UserError("--duration: only with --router (a policy's scenarios keep theirs)")
        card = run_scorecard(
            args.policy,
            baselines=args.baseline or list(DEFAULT_BASELINES),
            substrate=args.substrate or "sim",
            scenarios=args.scenarios,
            seeds=args.seeds or [1, 2, 3],
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


def _router_card(args: argparse.Namespace, out: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """`--router`: the external router's scorecard (testbed.scenario.scorecard_router)."""
    if args.hindsight:
        raise UserError("--hindsight runs on the sim substrate only; --router runs live")
    return run_router_scorecard(
        args.router,
        baselines=args.baseline or list(ROUTER_BASELINES),
        substrate=args.substrate or "local",
        scenarios=args.scenarios,
        seeds=args.seeds or [1],
        duration_s=args.duration or DEFAULT_DURATION_S,
        out=out,
        log=log,
        min_policy_share=args.min_policy_share,
        max_requests=args.max_requests,
    )


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "scorecard",
        help="score a routing policy against baselines over the whole scenario library",
        description="Run every library scenario (or --scenarios) for the policy and each "
        "baseline with the same seeds, and write scorecard.md, scorecard.json and "
        "scorecard.png: per scenario checker verdicts, goodput at the SLO, SLO attainment, "
        "TTFT p50/p90/p99, failures and cross-DC bytes against the baselines, the best fixed "
        "threshold in hindsight (sim), and one overall line. With --router instead of "
        "--policy, an external router is scored against our policies, live (docs/scorecard.md).",
    )
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument(
        "--policy",
        metavar="SPEC",
        help="what `testbed run --policy` takes: a built-in name, module:Class, an entry point",
    )
    who.add_argument(
        "--router",
        metavar="PRESET[:POLICY]",
        help="score an external router instead, e.g. vllm-router or sglang-router:round_robin: "
        f"live on the local substrate at time_scale 1, {len(ROUTER_SCENARIOS)} scenarios "
        f"({','.join(ROUTER_SCENARIOS)}) of {DEFAULT_DURATION_S:g} s by default, one seed; "
        "prints the expected wall time first (needs pip install -e '.[routers]')",
    )
    p.add_argument(
        "--baseline",
        type=_names,
        metavar="LIST",
        help=f"policies to compare against (default {','.join(DEFAULT_BASELINES)})",
    )
    p.add_argument(
        "--substrate",
        choices=list(SCORECARD_SUBSTRATES),
        help="where the runs go (default: sim; local with --router, which runs nowhere else)",
    )
    p.add_argument(
        "--scenarios",
        type=_names,
        metavar="LIST",
        help="library names or files (default: all; with --router the four above)",
    )
    p.add_argument(
        "--seeds", type=int_list, metavar="LIST", help="default 1,2,3 (with --router: 1)"
    )
    p.add_argument(
        "--duration",
        type=_positive_duration,
        metavar="DURATION",
        help=f"with --router: real-world (= wall) time of arrivals per run (default "
        f"{DEFAULT_DURATION_S:g}s); each scenario's faults are scaled into it",
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
