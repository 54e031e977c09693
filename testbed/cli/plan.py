"""`testbed plan SCENARIO.yaml`: the planner's best operating point for every deployment."""

from __future__ import annotations

import argparse
import json
from typing import Any

from testbed.cli.run import add_max_requests
from testbed.config.limits import FieldError
from testbed.planner import StagePlan, plan_deployment, plan_inputs
from testbed.scenario.library import resolve_scenario
from testbed.scenario.limits import check_request_count
from testbed.scenario.schema import Scenario, load_scenario
from testbed.units import UnitError, format_tokens, parse_tokens


def plan_scenario(scenario: Scenario, threshold: float | None = None) -> dict[str, StagePlan]:
    """Each deployment's best operating point; with `threshold`, t is fixed there (as a
    fixed-threshold policy runs) and only the PD split is searched."""
    inputs = plan_inputs(scenario)
    return {
        name: plan_deployment(name, dep, inputs, threshold_tokens=threshold)
        for name, dep in scenario.deployments.items()
    }


def check_plans(
    scenario: Scenario, plans: dict[str, StagePlan], max_requests: int | None = None
) -> None:
    """The request-count limits a run of each deployment would meet (prepare_run checks the
    same), so `testbed plan` refuses what `testbed run` would. A shift at `load` is counted at
    the base rate (its own lambda_max is planned by the run)."""
    arrivals = scenario.workload.arrivals
    shift = scenario.workload.shift
    for plan in plans.values():
        rate = arrivals.rate_for(plan.lambda_max_rps)
        shift_rate = shift.rate if shift is not None else None
        check_request_count(scenario, rate, shift_rate, scenario.duration, max_requests)


def render_table(plans: dict[str, StagePlan]) -> str:
    def fmt(v: float | None, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    rows: list[tuple[str, list[str]]] = [
        ("lambda_max (req/s)", [fmt(p.lambda_max_rps, ".2f") for p in plans.values()]),
        (
            "threshold t",
            [
                "-" if p.threshold_tokens is None else format_tokens(p.threshold_tokens)
                for p in plans.values()
            ],
        ),
        (
            "N_prfaas / N_p / N_d",
            [f"{p.n_prfaas or '-'} / {p.n_prefill or '-'} / {p.n_decode}" for p in plans.values()],
        ),
        (
            "Theta prfaas/pdp/pdd",
            [
                f"{fmt(p.theta_prfaas_rps, '.2f')} / {fmt(p.theta_pdp_rps, '.2f')} / "
                f"{p.theta_pdd_rps:.2f}"
                for p in plans.values()
            ],
        ),
        ("offload fraction", [f"{p.offload_fraction:.1%}" for p in plans.values()]),
        (
            "l_long / l_short",
            [
                f"{format_tokens(p.l_long_tokens)} / {format_tokens(p.l_short_tokens)}"
                for p in plans.values()
            ],
        ),
        ("egress (Gbps)", [f"{p.egress_gbps:.1f}" for p in plans.values()]),
        (
            "link use at lambda_max",
            [f"{p.link_utilisation:.0%}" if p.link_gbps else "-" for p in plans.values()],
        ),
        (
            "link carries up to",
            [
                "-" if p.link_max_rps is None else f"{p.link_max_rps:.2f} req/s"
                for p in plans.values()
            ],
        ),
        ("BS_max @ T_decode", [f"{p.bs_max} @ {p.t_decode_s * 1e3:.0f}ms" for p in plans.values()]),
        ("bottleneck", [p.bottleneck for p in plans.values()]),
        (
            "GPUs (req/s per GPU)",
            [f"{p.gpus} ({p.lambda_max_per_gpu:.4f})" for p in plans.values()],
        ),
    ]
    header = ["", *plans.keys()]
    widths = [max(len(r[0]) for r in rows)] + [
        max(len(h), *(len(r[1][i]) for r in rows)) for i, h in enumerate(header[1:])
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    for label, cells in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip([label, *cells], widths, strict=True)))
    return "\n".join(line.rstrip() for line in lines)


def _run(args: argparse.Namespace) -> int:
    path = resolve_scenario(args.scenario)
    scenario = load_scenario(path)
    try:
        plans = plan_scenario(scenario, args.threshold)
        check_plans(scenario, plans, args.max_requests)
    except FieldError as exc:
        raise exc.at(str(path)) from None
    if args.json:
        doc: dict[str, Any] = {
            "scenario": scenario.name,
            "deployments": {name: plan.to_json() for name, plan in plans.items()},
        }
        print(json.dumps(doc, indent=2))
    else:
        fixed = f", t fixed at {format_tokens(args.threshold)}" if args.threshold else ""
        print(f"planner: {scenario.name} (the paper's Eqs. 3-8{fixed})")
        print(render_table(plans))
    return 0


def _tokens(text: str) -> float:
    try:
        v = parse_tokens(text)
    except UnitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if v <= 0:
        raise argparse.ArgumentTypeError("must be greater than zero")
    return v


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "plan",
        help="analytic throughput plan (the paper's Eqs. 3-8) for each deployment",
        description="Print the planner's best operating point for every deployment of a "
        "scenario: lambda_max, threshold, instance split, stage throughputs and link egress.",
    )
    p.add_argument("scenario", help="scenario YAML file, or a library name (`testbed scenarios`)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument(
        "--threshold",
        type=_tokens,
        metavar="TOKENS",
        help='fix the threshold t (e.g. "19.5K") instead of searching it: what a fixed-threshold '
        "policy such as prfaas-static runs; the PD split is still searched",
    )
    add_max_requests(p)
    p.set_defaults(func=_run)
