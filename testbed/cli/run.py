"""`testbed run SCENARIO.yaml`: run a scenario live and write its results.

Also `testbed scenarios`: list the scenario library with each file's one-line description.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from testbed.clock import LiveClock
from testbed.errors import UserError
from testbed.metrics.bench import DEFAULT_PERCENTILES, parse_percentiles
from testbed.metrics.summary import to_text
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.runner import run_scenario
from testbed.scenario.schema import load_scenario
from testbed.substrate import SUBSTRATES

SCENARIO_DIR = Path("scenarios")


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError("must be greater than zero")
    return v


def _percentiles(text: str) -> tuple[float, ...]:
    try:
        return parse_percentiles(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_percentiles(p: argparse.ArgumentParser) -> None:
    """`--percentiles 50,90,95,99` (run and up): latency percentiles in summary.json."""
    p.add_argument(
        "--percentiles",
        type=_percentiles,
        default=DEFAULT_PERCENTILES,
        metavar="LIST",
        help="latency percentiles for summary.json, comma-separated (p50, p90 and p99 are "
        "always there; default 50,90,99)",
    )


def _run(args: argparse.Namespace) -> int:
    if args.substrate not in SUBSTRATES:
        raise UserError(f"substrate {args.substrate!r} is not available; use 'local' or 'compose'")
    scenario = load_scenario(args.scenario)
    out = Path(args.out) if args.out else Path("results") / scenario.name
    opts = RunOptions(
        substrate=args.substrate,
        policy=args.policy,
        trace=args.trace,
        duration_s=args.duration,
        out_dir=out,
        progress=not args.quiet,
        percentiles=args.percentiles,
    )
    rp = prepare_run(scenario, opts)
    clock = LiveClock.paced(scenario.scale)
    wall = clock.wall(rp.duration_s)
    rate = f"{rp.rate_rps:.2f} req/s" if rp.rate_rps else "trace timing"
    threshold = f", t={rp.threshold_tokens:.0f} tokens" if rp.threshold_tokens else ""
    print(
        f"testbed: {scenario.name}: {rp.policy} on {rp.deployment_name} "
        f"({(rp.deployment.prfaas.instances if rp.deployment.prfaas else 0)} PrfaaS + "
        f"{rp.n_prefill} PD-P + {rp.n_decode} PD-D){threshold}; {len(rp.requests)} requests at "
        f"{rate} over {rp.duration_s:.0f}s real-world (~{wall:.0f}s wall at time_scale "
        f"{clock.time_scale:g}, "
        f"byte_scale {scenario.scale.byte_scale:g})",
        file=sys.stderr,
    )
    bar: Any = None
    if opts.progress:
        from tqdm import tqdm

        bar = tqdm(total=len(rp.requests), unit="req", desc="requests", file=sys.stderr)

    def progress(done: int, submitted: int) -> None:
        if bar is not None:
            bar.n = done
            bar.set_postfix(submitted=submitted, in_flight=submitted - done, refresh=False)
            bar.refresh()

    try:
        result = asyncio.run(run_scenario(rp, opts, progress))
    finally:
        if bar is not None:
            bar.close()
    print(to_text(result.summary))
    for check in result.checks:
        shown = {"ok": "ok", "failed": "FAILED", "vacuous": "VACUOUS"}[check.verdict]
        print(f"check {check.name}: {shown} - {check.detail}")
    print(f"results: {out}/ (requests.jsonl, summary.json, report.md, timeline.png)")
    return result.exit_code


def _list(_args: argparse.Namespace) -> int:
    files = sorted(SCENARIO_DIR.glob("*.yaml"))
    if not files:
        raise UserError(f"no scenarios in {SCENARIO_DIR}/ (run from the project root)")
    width = max(len(f.stem) for f in files)
    for f in files:
        print(f"{f.stem.ljust(width)}  {load_scenario(f).description}")
    return 0


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "run",
        help="run a scenario live and write results",
        description="Stand up the scenario's deployment, drive its workload, and write "
        "requests.jsonl, history.jsonl, summary.json, report.md and timeline.png.",
    )
    p.add_argument("scenario", help="scenario YAML file")
    p.add_argument("--substrate", default="local", choices=list(SUBSTRATES))
    p.add_argument("--policy", help="routing policy (default: the scenario's)")
    p.add_argument("--trace", help="Mooncake JSONL trace to replay")
    p.add_argument(
        "--duration",
        type=_positive_float,
        metavar="SECONDS",
        help="real-world seconds of arrivals (default: the scenario's)",
    )
    p.add_argument("--out", metavar="DIR", help="results directory (default: results/NAME)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_percentiles(p)
    p.set_defaults(func=_run)
    s = sub.add_parser("scenarios", help="list the scenario library")
    s.set_defaults(func=_list)
