"""`testbed run SCENARIO.yaml`: run a scenario live and write its results.

Also `testbed scenarios`: list the scenario library with each file's one-line description.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed.cli.progress import ProgressDisplay
from testbed.cli.verify import positive_int
from testbed.clock import LiveClock
from testbed.config.limits import DEFAULT_MAX_REQUESTS
from testbed.errors import UserError
from testbed.metrics.bench import DEFAULT_PERCENTILES, parse_percentiles
from testbed.metrics.summary import to_text
from testbed.scenario.library import LIBRARY_DIR, library_scenarios, resolve_scenario
from testbed.scenario.plan import RunOptions, RunPlan, RunResult, prepare_run
from testbed.scenario.schema import load_scenario
from testbed.scenario.sweep import parse_setting, scenario_with_settings
from testbed.substrates import load_attr, substrate_facts, substrate_names
from testbed.units import UnitError, parse_duration

RUN_SUBSTRATES = substrate_names()
"""Where `testbed run` can run a scenario: every substrate of the registry (testbed.substrates),
live or in virtual time."""


def _positive_duration(text: str) -> float:
    """A duration flag: "20s", "2m", "500ms", or a bare number of seconds."""
    try:
        v = parse_duration(text)
    except UnitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
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


def add_max_requests(p: argparse.ArgumentParser) -> None:
    """`--max-requests N` (run, plan, up, sweep, hindsight, scorecard): the cap on the requests
    a run plans, raised or lowered for those who mean it (docs/failures.md, "Limits")."""
    p.add_argument(
        "--max-requests",
        type=positive_int,
        metavar="N",
        help=f"the most requests the run may plan (default {DEFAULT_MAX_REQUESTS:,}; a "
        "scenario that plans more is refused before anything is allocated)",
    )


def _setting(text: str) -> tuple[str, str]:
    try:
        return parse_setting(text)
    except UserError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_set(p: argparse.ArgumentParser, help: str | None = None) -> None:
    """`--set PATH=VALUE`, repeatable (run and hindsight; bench/fidelity.py with its own
    `help`): a field of the scenario file replaced for this run, by the paths
    `testbed sweep --set` takes."""
    p.add_argument(
        "--set",
        type=_setting,
        action="append",
        default=[],
        dest="settings",
        metavar="PATH=VALUE",
        help=help
        or "replace a field of the scenario file for this run, by its path in the file, e.g. "
        "workload.arrivals.load=1.0 or deployments.prfaas-pd.link.bandwidth=10Gbps; repeat for "
        "more fields (the command line and the scenario's digest go to summary.json)",
    )


def _run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    facts = substrate_facts(args.substrate)  # an unknown name: one line naming them all
    path = resolve_scenario(args.scenario)
    scenario = scenario_with_settings(path, args.settings) if args.settings else load_scenario(path)
    if args.router:  # an external router in front (docs/real-routers.md)
        from testbed.scenario.external_run import with_router

        timed = any(k == "scale.time_scale" for k, _ in args.settings or ())
        scenario = with_router(scenario, args.router, timed)
    out = Path(args.out) if args.out else Path("results") / scenario.name
    opts = RunOptions(
        substrate=args.substrate,
        policy=args.policy,
        trace=args.trace,
        duration_s=args.duration,
        out_dir=out,
        progress=not args.quiet,
        shaper=args.shaper,
        seed=args.seed,
        percentiles=args.percentiles,
        max_requests=args.max_requests,
        source=str(path),
        timeline=not args.no_timeline,
    )
    rp = prepare_run(scenario, opts)
    if rp.scenario.router is not None and not facts.external_router:
        raise UserError(
            f"router: an external router runs on the local substrate only, so far (not "
            f"{opts.substrate}; docs/real-routers.md)"
        )
    if facts.simulate is not None:
        return _simulate(rp, opts, started, load_attr(facts.simulate))
    clock = LiveClock.paced(rp.scenario.scale)  # `time_scale: auto` resolved by prepare_run
    wall = clock.wall(rp.duration_s)
    rate = f"{rp.rate_rps:.2f} req/s" if rp.rate_rps else "trace timing"
    threshold = f", t={rp.threshold_tokens:.0f} tokens" if rp.threshold_tokens else ""
    print(
        f"testbed: {scenario.name}: {rp.policy} on {rp.deployment_name} "
        f"({(rp.deployment.prfaas.instances if rp.deployment.prfaas else 0)} PrfaaS + "
        f"{rp.n_prefill} PD-P + {rp.n_decode} PD-D){threshold}; {len(rp.requests)} requests at "
        f"{rate} over {rp.duration_s:.0f}s real-world: arrivals take ~{wall:.0f}s wall at "
        f"time_scale {clock.time_scale:g} (byte_scale {rp.scenario.scale.byte_scale:g}), plus "
        "start-up, the drain of what is in flight, and writing the results",
        file=sys.stderr,
    )
    if rp.shaper_note is not None:
        print(f"testbed: link shaper: {rp.shaper_note}", file=sys.stderr)
    display = ProgressDisplay(bar=True) if opts.progress else None
    try:
        if rp.scenario.router is not None:
            from testbed.scenario.external_run import run_external

            result = asyncio.run(run_external(rp, opts, display))
        else:
            from testbed.scenario.runner import run_scenario  # aiohttp: live runs only

            result = asyncio.run(run_scenario(rp, opts, display))
    finally:
        if display is not None:
            display.close()
    return _report(result)


def _simulate(
    rp: RunPlan, opts: RunOptions, started: float, simulate: Callable[..., RunResult]
) -> int:
    """A virtual-time substrate (`--substrate sim`, testbed.sim): the scenario simulated in
    one process by the entry's `simulate` (testbed.scenario.sim_run.run_sim), same results."""
    sc = rp.scenario
    print(
        f"testbed: {sc.name}: {rp.policy} on {rp.deployment_name} "
        f"({(rp.deployment.prfaas.instances if rp.deployment.prfaas else 0)} PrfaaS + "
        f"{rp.n_prefill} PD-P + {rp.n_decode} PD-D); {len(rp.requests)} requests over "
        f"{rp.duration_s:.0f}s real-world, simulated (seed {sc.seed})",
        file=sys.stderr,
    )
    return _report(simulate(rp, opts, started))


def _report(result: RunResult) -> int:
    print(to_text(result.summary))
    for check in result.checks:
        shown = {"ok": "ok", "failed": "FAILED", "vacuous": "VACUOUS"}[check.verdict]
        print(f"check {check.name}: {shown} - {check.detail}")
    picture = ", timeline.png" if (result.out_dir / "timeline.png").exists() else ""
    print(f"results: {result.out_dir}/ (requests.jsonl, summary.json, report.md{picture})")
    return result.exit_code


def _list(_args: argparse.Namespace) -> int:
    files = library_scenarios()
    if not files:
        raise UserError(f"no scenarios in {LIBRARY_DIR}/ (a broken installation)")
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
    p.add_argument("scenario", help="scenario YAML file, or a library name (`testbed scenarios`)")
    p.add_argument(
        "--substrate",
        default="local",
        choices=list(substrate_names()),
        help="where to run: "
        + "; ".join(f"{n}, {substrate_facts(n).description}" for n in substrate_names()),
    )
    p.add_argument(
        "--seed",
        type=int,
        metavar="N",
        help="replace the scenario's seed (workload, fault targets, link jitter)",
    )
    p.add_argument("--policy", help="routing policy (default: the scenario's)")
    p.add_argument("--trace", help="Mooncake JSONL trace to replay")
    p.add_argument(
        "--router",
        metavar="PRESET[:POLICY]",
        help="an external router in front of the fleet instead of ours, e.g. vllm-router or "
        "sglang-router:round_robin (needs pip install -e '.[routers]'; time_scale 1 unless "
        "--set scale.time_scale=...; docs/real-routers.md)",
    )
    p.add_argument(
        "--duration",
        type=_positive_duration,
        metavar="DURATION",
        help='real-world time of arrivals: "20s", "2m", "500ms"; a bare number is seconds '
        "(default: the scenario's)",
    )
    p.add_argument(
        "--shaper",
        choices=("emulator", "tc"),
        help="what caps the link's bandwidth (default: the scenario's link.shaper)",
    )
    add_set(p)
    p.add_argument("--out", metavar="DIR", help="results directory (default: results/NAME)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--no-timeline",
        action="store_true",
        help="do not draw timeline.png (about 0.7 CPU s; a sim run's largest fixed cost): "
        "`testbed timeline DIR` draws it from the results later",
    )
    add_percentiles(p)
    add_max_requests(p)
    p.set_defaults(func=_run)
    s = sub.add_parser("scenarios", help="list the scenario library")
    s.set_defaults(func=_list)
