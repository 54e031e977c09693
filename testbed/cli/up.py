"""`testbed up SCENARIO.yaml`: stand the scenario's deployment up for outside clients until
Ctrl-C or SIGTERM, then write the usual results (scenario.standing). Every request's record is
journaled before its client sees it end, so even a SIGKILL keeps them; a service that dies is
reported at once and in the exit report; `--prometheus` (compose) adds a Prometheus server
scraping every service; `--router` puts an external router in front (scenario.standing_router)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from pathlib import Path
from typing import Any

from testbed.cli.run import add_max_requests, add_percentiles
from testbed.errors import UserError
from testbed.metrics.summary import to_text
from testbed.scenario.library import resolve_scenario
from testbed.scenario.plan import RunOptions, prepare_run
from testbed.scenario.schema import load_scenario
from testbed.scenario.standing import Endpoints, at_time_scale, stand_up
from testbed.services.router.text import TOKENIZER_DIR
from testbed.substrates import substrate_facts, substrates_with


def _standing() -> tuple[str, ...]:
    """Where `testbed up` can stand a deployment up (testbed.substrates), read when asked so
    an entry added after import (a test's toy) is offered too."""
    return substrates_with(lambda s: s.standing)


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < v < float("inf"):
        raise argparse.ArgumentTypeError("must be a finite number greater than zero")
    return v


def _banner(ep: Endpoints, time_scale: float) -> None:
    lines = [
        f"OpenAI base URL:  {ep.openai_base}",
        *([f"external router: {ep.external}"] if ep.external else []),
        f"tokenizer:        {TOKENIZER_DIR}",
        f"link API:         {ep.link_api or '- (no link in this deployment)'}",
        *(f"metrics {sid}: {url}" for sid, url in ep.metrics.items()),
        *([f"Prometheus:       {ep.prometheus}"] if ep.prometheus else []),
        f"serving at time_scale {time_scale:g}; Ctrl-C or SIGTERM stops and writes results",
    ]
    print("\n".join(lines), flush=True)


def _notice(line: str) -> None:
    print(f"testbed: {line}", file=sys.stderr, flush=True)


def _refuse_with_router(args: argparse.Namespace) -> None:
    """What an external router does not stand up with, said before anything starts."""
    if not substrate_facts(args.substrate).external_router:
        raise UserError(
            f"router: an external router runs on the local substrate only, so far (not "
            f"{args.substrate}; docs/real-routers.md)"
        )
    if args.prometheus:
        raise UserError("--prometheus needs --substrate compose, which an external router "
                        "does not run on (docs/real-routers.md)")  # fmt: skip
    if args.time_scale not in (None, 1.0):
        raise UserError(
            f"--time-scale {args.time_scale:g}: an external router runs at time_scale 1 (its "
            "timers are wall-clock; docs/real-routers.md)"
        )


def _up(args: argparse.Namespace) -> int:
    if args.substrate not in _standing():
        raise UserError(
            f"substrate {args.substrate!r} is not available; use one of {', '.join(_standing())}"
        )
    scenario = load_scenario(resolve_scenario(args.scenario))
    if args.router:  # an external router in front (docs/real-routers.md, "testbed up --router")
        from testbed.scenario.external_run import with_router

        scenario = with_router(scenario, args.router, time_scale_set=True)
    if scenario.router is not None:
        _refuse_with_router(args)
    if args.prometheus and not substrate_facts(args.substrate).prometheus:
        raise UserError("--prometheus needs --substrate compose (it runs as a container)")
    out = Path(args.out) if args.out else Path("results") / f"{scenario.name}-up"
    opts = RunOptions(
        substrate=args.substrate,
        policy=args.policy,
        out_dir=out,
        progress=False,
        percentiles=args.percentiles,
        max_requests=args.max_requests,
    )
    time_scale = args.time_scale if args.time_scale is not None else 1.0
    # The plan's requests are for `run`'s load generator: outside clients are the load here, so
    # they are dropped at once instead of held for as long as the deployment stands (the cap
    # on how many a scenario may plan still applies, and --max-requests moves it).
    rp = dataclasses.replace(at_time_scale(prepare_run(scenario, opts), time_scale), requests=[])
    if time_scale != 1.0:
        print(
            f"testbed: warning: time_scale {time_scale:g}: the deployment runs {time_scale:g}x "
            "faster than real time, so latencies a client measures are real-world latencies "
            f"divided by {time_scale:g} (the results and /metrics are in real-world units)",
            file=sys.stderr,
        )
    faults = "no faults" if args.no_faults else f"{len(rp.faults)} faults on its timeline"
    print(
        f"testbed: {scenario.name}: {rp.policy} on {rp.deployment_name} "
        f"({rp.deployment.prfaas.instances if rp.deployment.prfaas else 0} PrfaaS + "
        f"{rp.n_prefill} PD-P + {rp.n_decode} PD-D), {faults}; starting...",
        file=sys.stderr,
    )
    stand = stand_up
    if rp.scenario.router is not None:
        from testbed.scenario.standing_router import stand_up_router as stand
    result = asyncio.run(
        stand(
            rp,
            opts,
            faults=not args.no_faults,
            on_ready=lambda e: _banner(e, time_scale),
            prometheus=args.prometheus,
            on_notice=_notice,
        )
    )
    print(to_text(result.summary))
    for note in result.notes:  # services dead at exit, a stalled keeper, the signal
        print(f"note: {note}")
    for check in result.checks:
        shown = {"ok": "ok", "failed": "FAILED", "vacuous": "VACUOUS"}[check.verdict]
        print(f"check {check.name}: {shown} - {check.detail}")
    print(f"results: {out}/ (requests.jsonl, summary.json, report.md, timeline.png)")
    return result.exit_code


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "up",
        help="stand a scenario's deployment up for outside clients until Ctrl-C",
        description="Start the scenario's deployment and serve the OpenAI API (completions, "
        "chat completions, models) and Prometheus /metrics until Ctrl-C or SIGTERM, playing "
        "the scenario's faults; then write requests.jsonl, summary.json, report.md, "
        "timeline.png and the checkers' verdicts for every request any client sent.",
    )
    p.add_argument("scenario", help="scenario YAML file, or a library name")
    p.add_argument("--substrate", default="local", choices=list(_standing()))
    p.add_argument("--policy", help="routing policy (default: the scenario's)")
    p.add_argument(
        "--time-scale",
        type=_positive_float,
        metavar="K",
        help="run K times faster than real time (default 1, whatever the scenario says: "
        "clients then measure real-world latency directly)",
    )
    p.add_argument("--no-faults", action="store_true", help="do not play the nemesis timeline")
    p.add_argument(
        "--router",
        metavar="PRESET[:POLICY]",
        help="an external router in front of the fleet, whose URL the banner gives, e.g. "
        "sglang-router or vllm-router:round_robin (needs pip install -e '.[routers]'; "
        "time_scale 1, local substrate; docs/real-routers.md)",
    )
    p.add_argument(
        "--prometheus",
        action="store_true",
        help="with --substrate compose: add a Prometheus server (Debian's package, in a "
        "container on 127.0.0.1) scraping the router and every worker; prints its URL",
    )
    p.add_argument("--out", metavar="DIR", help="results directory (default: results/NAME-up)")
    add_percentiles(p)
    add_max_requests(p)
    p.set_defaults(func=_up)
