"""Where the gap between the sim's saturation throughput and the planner's lambda_max comes from
(issue #15, acceptance 2), for the paper's prfaas-pd, homogeneous and naive deployments.

Each deployment is offered 120% of the planner's lambda_max A (the method of bench/fidelity.py
and bench/sim_saturation.py: completion rate over the last five sixths of the run). The gap
S_real - A is split into three parts that add up to it, each its own figure:

- **mean lengths** = S_real - S_mean. S_mean is the same run (same arrivals, same routes, same
  threshold and PD split) with every request's length replaced by the planner's mean for its
  class: l_long (the mean above the threshold) for requests routed to PrfaaS, l_short below it
  (homogeneous and naive: the overall mean). The planner costs a stage at T_prefill(mean l);
  real requests cost the mean of T_prefill(l), larger since T_prefill is convex in l (attention).
- **stage imbalance** = F - A. F is the fluid model's saturation in the planner's own world:
  with the threshold routing a fixed share of the offered requests to each prefill stage, each
  stage completes min(its capacity, what it is offered), decode caps the sum:
  F = min(Theta_pdd, min(Theta_prfaas, 1.2 p A) + min(Theta_pdp, 1.2 (1-p) A)), with p the run's
  own share of long requests. The planner's grid (threshold step, whole instances) leaves the
  two prefill stages unequal; at saturation the stronger one keeps completing its class beyond
  A, so F >= A. Homogeneous and naive have one prefill stage: 0 there.
- **queueing** = S_mean - F: what the simulated system loses against the fluid model with
  nothing but mean lengths: prefill FIFOs, decode admission at step boundaries, transfers, and
  the run's finite window (requests still in the pipeline at its end).

The mean-lengths part is split once more with the fluid model run on the real requests (F_true:
each prefill stage's capacity from the mean of T_prefill over the requests it gets, the link's
from the mean S_kv): **convexity** = F_true - F is what the mean-length simplification costs a
fluid system; the rest, S_real - S_mean - (F_true - F), is what variable lengths add in queueing
(a long prompt holding a FIFO, uneven decode admissions).

Usage: python bench/sim_gap.py [--duration 600] [--seeds 1]   (seconds per deployment)
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from pathlib import Path
from typing import Any

from provenance import reported  # bench/ is on sys.path

from testbed.experiment import Grid, completion_rate, steady_window
from testbed.profiles import MODELS
from testbed.scenario.plan import RunPlan, prepare_run
from testbed.scenario.sim_run import sim_inputs
from testbed.scenario.sweep import sim_options
from testbed.sim import simulate
from testbed.units import parse_duration
from testbed.workload.build import length_distribution

CASES = (("prfaas-pd", "prfaas-static"), ("homogeneous", "homogeneous"), ("naive", "naive"))
SATURATION_LOAD = 1.2


def saturation_plan(dep: str, policy: str, duration: float, seed: int) -> RunPlan:
    g = Grid.of(
        "paper",
        fixed={
            "deployment": dep,
            "duration": f"{duration:g}s",
            "seed": seed,
            "checkers": [],
            "policy.name": policy,
            "workload.arrivals.load": SATURATION_LOAD,
        },
    )
    sc = g.scenario_of()
    return prepare_run(sc, sim_options())


def rate(rp: RunPlan, duration: float) -> float:
    opts = sim_options()
    out = simulate(sim_inputs(rp, opts))
    return completion_rate(out.records, *steady_window(duration))


def mean_lengths(rp: RunPlan) -> tuple[RunPlan, float]:
    """The run with each request at its class's planner mean; and the run's share of long."""
    plan = rp.plan
    t = rp.threshold_tokens
    if t is None:  # one prefill stage: everything at the overall mean
        mean = length_distribution(rp.scenario.workload.lengths).mean()
        reqs = [dataclasses.replace(r, input_tokens=round(mean)) for r in rp.requests]
        return dataclasses.replace(rp, requests=reqs), plan.offload_fraction
    long_ = [r.input_tokens > t for r in rp.requests]
    reqs = [
        dataclasses.replace(
            r, input_tokens=round(plan.l_long_tokens if is_long else plan.l_short_tokens)
        )
        for r, is_long in zip(rp.requests, long_, strict=True)
    ]
    return dataclasses.replace(rp, requests=reqs), sum(long_) / max(len(long_), 1)


def fluid(rp: RunPlan, p: float) -> float:
    plan = rp.plan
    a = plan.lambda_max_rps
    offered = SATURATION_LOAD * a
    if plan.theta_prfaas_rps is None or plan.theta_pdp_rps is None:
        return min(a * SATURATION_LOAD, a)  # one prefill stage: it saturates at A
    prefill = min(plan.theta_prfaas_rps, p * offered) + min(plan.theta_pdp_rps, (1 - p) * offered)
    return min(plan.theta_pdd_rps, prefill)


def fluid_true(rp: RunPlan, p: float) -> float:
    """F with each stage's capacity from the mean cost of the requests it gets."""
    plan, dep = rp.plan, rp.deployment
    model = MODELS[dep.model]
    offered = SATURATION_LOAD * plan.lambda_max_rps
    t = rp.threshold_tokens
    lens = [r.input_tokens for r in rp.requests]
    if t is None:  # one prefill stage, all requests
        if dep.prfaas is not None and plan.theta_pdp_rps is None:  # naive: all on PrfaaS
            cost = statistics.mean(model.prefill_time(dep.prfaas.hardware, n) for n in lens)
            kv = statistics.mean(model.kv_bytes(n) for n in lens)
            stage = min(dep.prfaas.instances / cost, dep.link.bandwidth / kv)
        else:
            cost = statistics.mean(model.prefill_time(dep.local.hardware, n) for n in lens)
            stage = plan.n_prefill / cost
        return min(plan.theta_pdd_rps, stage, offered)
    assert dep.prfaas is not None
    long_ = [n for n in lens if n > t]
    short = [n for n in lens if n <= t]
    cost_l = statistics.mean(model.prefill_time(dep.prfaas.hardware, n) for n in long_)
    kv = statistics.mean(model.kv_bytes(n) for n in long_)
    th_prfaas = min(dep.prfaas.instances / cost_l, dep.link.bandwidth / kv)
    th_pdp = plan.n_prefill / statistics.mean(
        model.prefill_time(dep.local.hardware, n) for n in short
    )
    prefill = min(th_prfaas, p * offered) + min(th_pdp, (1 - p) * offered)
    return min(plan.theta_pdd_rps, prefill)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--duration", type=parse_duration, default=600.0)
    ap.add_argument("--seeds", type=int, default=1, help="seeds 1..N, figures averaged")
    ap.add_argument("--report", type=Path, metavar="FILE", help="also write the table here")
    args = ap.parse_args()
    setup = (
        f"sim; scenarios/paper.yaml's three deployments at {SATURATION_LOAD:.0%} of "
        f"lambda_max, {args.duration:.0f} s real-world, seeds 1..{args.seeds}"
    )
    reported(args.report, "sim_gap", "The gap to the planner", setup, lambda: measure(args))
    return 0


def measure(args: argparse.Namespace) -> None:
    """Print the table: a row per deployment, its gap to the planner split into parts."""
    d = args.duration
    print(
        f"saturation gap to the planner, sim, {SATURATION_LOAD:.0%} of lambda_max, {d:.0f}s "
        f"real-world, seeds 1..{args.seeds} (figures as % of the planner's lambda_max)"
    )
    print(
        "| deployment | planner A | sim S_real | gap | mean lengths | (convexity) | "
        "(variable-length queueing) | stage imbalance | queueing | S_mean | F | F_true |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for dep, policy in CASES:
        rows: list[dict[str, Any]] = []
        for seed in range(1, args.seeds + 1):
            rp = saturation_plan(dep, policy, d, seed)
            a = rp.plan.lambda_max_rps
            s_real = rate(rp, d)
            rp_mean, p = mean_lengths(rp)
            s_mean = rate(rp_mean, d)
            f = fluid(rp, p)
            f_true = fluid_true(rp, p)
            rows.append({"a": a, "s_real": s_real, "s_mean": s_mean, "f": f, "f_true": f_true})
        m = {k: statistics.mean(r[k] for r in rows) for k in rows[0]}
        a = m["a"]

        def pct(x: float, a: float = a) -> str:
            return f"{x / a:+.1%}"

        print(
            f"| {dep} | {a:.2f} | {m['s_real']:.2f} | {pct(m['s_real'] - a)} | "
            f"{pct(m['s_real'] - m['s_mean'])} | {pct(m['f_true'] - m['f'])} | "
            f"{pct(m['s_real'] - m['s_mean'] - (m['f_true'] - m['f']))} | {pct(m['f'] - a)} | "
            f"{pct(m['s_mean'] - m['f'])} | {m['s_mean']:.2f} | {m['f']:.2f} | {m['f_true']:.2f} |"
        )


if __name__ == "__main__":
    raise SystemExit(main())
