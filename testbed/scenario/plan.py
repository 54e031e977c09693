"""What a run is before anything starts: its options, its plan, and what it ends with.

`prepare_run` decides the policy, the deployment, the threshold, the PD split, the arrival rate,
the requests and the nemesis timeline from a scenario, and refuses a fault or a checker the run
cannot exercise, all before the first process starts. The live run (testbed.scenario.runner)
carries a `RunPlan` out; the results (testbed.scenario.results) make the `RunResult`.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from testbed.checkers import checkers_fit
from testbed.checkers.policy_share import PolicyShareCheck
from testbed.config import DeploymentConfig
from testbed.config.limits import FieldError
from testbed.engine.torch import live
from testbed.errors import UserError
from testbed.metrics.bench import DEFAULT_PERCENTILES
from testbed.metrics.records import HistoryEvent, RequestRecord
from testbed.nemesis import (
    PlannedFault,
    burst_requests,
    check_timeline_fits,
    plan_faults,
    refuse_unplayable,
)
from testbed.nemesis.process import group_ids
from testbed.planner import StagePlan, plan_deployment, plan_inputs
from testbed.policy import POLICIES, get_policy
from testbed.policy.base import measures_link
from testbed.policy.http import is_http_spec
from testbed.scenario.limits import check_request_count, check_requests_made
from testbed.scenario.schema import Scenario
from testbed.scheduler.spec import SchedulerSpec
from testbed.substrate.layout import Layout
from testbed.substrate.shaper import preflight_shaper
from testbed.substrates import load_attr, substrate_facts
from testbed.workload.build import length_distribution
from testbed.workload.generate import RequestSpec, generate_requests

__all__ = ["RunOptions", "RunPlan", "RunResult", "outside_policy", "prepare_run", "with_defaults"]


@dataclass
class RunOptions:
    substrate: str = "local"
    policy: str | None = None
    trace: str | None = None
    duration_s: float | None = None
    out_dir: Path = Path("results/run")
    progress: bool = True
    drain_timeout_s: float = 120.0
    """Wall seconds to wait for in-flight requests after the last arrival."""
    shaper: str | None = None
    """`testbed run --shaper`: overrides the deployment's `link.shaper` ("emulator", "tc")."""
    seed: int | None = None
    """Replaces the scenario's seed (workload, fault targets, link jitter), on every substrate."""
    max_requests: int | None = None
    """`--max-requests N`: the most requests the run may plan; None: DEFAULT_MAX_REQUESTS
    (testbed.config.limits). A cap, not a cut: past it the run is refused."""
    source: str | None = None
    """The scenario's file, for errors found while planning (None: its name stands in)."""

    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    """Latency percentiles in summary.json besides p50/p90/p99 (`--percentiles`)."""
    timeline: bool = True
    """Draw timeline.png (matplotlib: about 0.7 CPU s per run, bench/reports/durations.md). The
    test suite's scenario runs turn it off (tests/chaos/harness.py); every other result file
    is written the same."""
    started_at: float = field(default_factory=time.time)
    """When the run was asked for (Unix time), for the summary's metadata."""


@dataclass(frozen=True)
class Progress:
    """Where a run stands, for a progress display: in the units the report uses (real-world
    seconds of workload, requests), with start-up and the results phase apart from the run."""

    phase: Literal["starting", "running", "draining", "results"]
    done: int = 0
    """Requests ended (completed or failed)."""
    submitted: int = 0
    planned: int = 0
    workload_s: float = 0.0
    """Real-world seconds since the first arrival's origin (0 while starting)."""
    duration_s: float = 0.0
    """Real-world seconds of arrivals the run plans."""
    services: int = 0
    """Services the substrate starts (shown while starting)."""

    @classmethod
    def of(cls, rp: RunPlan, now: float, done: int, submitted: int) -> Progress:
        """A run at real-world time `now` of its load: arriving until the plan's arrivals are
        all submitted (or its duration is over), then draining."""
        arriving = now < rp.duration_s and submitted < len(rp.requests)
        return cls(
            "running" if arriving else "draining",
            done=done,
            submitted=submitted,
            planned=len(rp.requests),
            workload_s=min(max(now, 0.0), rp.duration_s),
            duration_s=rp.duration_s,
        )


@dataclass
class RunPlan:
    """Everything decided before the first process starts."""

    scenario: Scenario
    deployment_name: str
    deployment: DeploymentConfig
    policy: str
    plan: StagePlan
    threshold_tokens: float | None
    n_prefill: int
    n_decode: int
    rate_rps: float | None
    duration_s: float
    requests: list[RequestSpec]
    layout: Layout
    """The instances, the scheduler loops' spec and the starting events, for every substrate."""
    faults: list[PlannedFault] = field(default_factory=list)
    """The nemesis timeline, targets resolved (testbed.nemesis)."""
    shift_plan: StagePlan | None = None
    """The planner's optimum for the lengths after `workload.shift` (PD split free)."""
    shift_rate_rps: float | None = None
    shaper_note: str | None = None
    """Which shaper caps the link and how, checked (testbed.substrate.shaper); None: no link."""
    calibration: dict[str, Any] | None = None
    """engine: torch: the host's calibrated compute and the time_scale it allows (the report
    shows it); the scenario's scale holds the resolved time_scale."""


@dataclass
class RunResult:
    out_dir: Path
    records: list[RequestRecord]
    history: list[HistoryEvent]
    summary: dict[str, Any]
    checks: list[Any]
    interrupted: bool = False
    notes: list[str] = field(default_factory=list)
    signal: int | None = None
    """The signal that stopped the run early (SIGINT, SIGTERM, SIGHUP), if one did."""

    @property
    def ok(self) -> bool:
        """No check failed (a vacuous one does not fail the run: `verdict`, not each `ok`)."""
        return all(c.verdict != "failed" for c in self.checks)

    @property
    def exit_code(self) -> int:
        """What `testbed run` exits with: 128 + the signal when one stopped it (130 for
        Ctrl-C, 143 for SIGTERM, 129 for SIGHUP), else 0 when no checker failed (passed or
        vacuous), 1 if one did."""
        if self.signal is not None:
            return 128 + self.signal
        if self.interrupted:
            return 128 + signal.SIGINT
        return 0 if self.ok else 1


def _pick_deployment(scenario: Scenario, policy: str) -> tuple[str, DeploymentConfig]:
    if scenario.deployment is not None:
        return scenario.deployment, scenario.deployments[scenario.deployment]
    if len(scenario.deployments) == 1:
        return next(iter(scenario.deployments.items()))
    kind = get_policy(policy).deployment_kind
    for name, dep in scenario.deployments.items():
        if dep.kind == kind:
            return name, dep
    raise UserError(
        f"scenario {scenario.name!r} has no {kind} deployment for policy {policy!r}; "
        f"set 'deployment' to one of: {', '.join(scenario.deployments)}"
    )


def outside_policy(spec: str) -> bool:
    """A policy from outside the package (module:Class, an entry point, an HTTP service): the
    one kind that has a fallback deciding when it fails (testbed.policy.decider)."""
    return is_http_spec(spec) or POLICIES.is_plugin(spec)


def with_defaults(scenario: Scenario, policy: str) -> Scenario:
    """The scenario with the checkers every run of `policy` carries besides its own: for an
    outside policy `policy_share` (it decided at least 99% itself), unless the scenario lists
    one already (with its own `min`)."""
    if not outside_policy(policy) or any(c.check == "policy_share" for c in scenario.checkers):
        return scenario
    return scenario.model_copy(update={"checkers": [*scenario.checkers, PolicyShareCheck()]})


def prepare_run(scenario: Scenario, opts: RunOptions) -> RunPlan:
    """Decide the policy, deployment, threshold, PD split, arrival rate and requests, refusing
    a size past its limit (testbed.config.limits) before anything is allocated: the same path
    for every substrate, so none can skip it."""
    try:
        return _prepare(scenario, opts)
    except FieldError as exc:
        raise exc.at(opts.source or f"scenario {scenario.name!r}") from None


def _prepare(scenario: Scenario, opts: RunOptions) -> RunPlan:
    if opts.seed is not None:
        scenario = scenario.model_copy(update={"seed": opts.seed})
    policy = opts.policy or scenario.policy.name
    get_policy(policy)  # an unknown name, or a plugin that cannot load: one line, now
    scenario = with_defaults(scenario, policy)
    where = substrate_facts(opts.substrate)
    if not where.outside_policies and POLICIES.is_plugin(policy):
        raise UserError(
            f"policy plugin {policy!r} runs on the local substrate: the compose images carry "
            "only the testbed's own policies (docs/extending.md)"
        )
    name, dep = _pick_deployment(scenario, policy)
    facts = get_policy(policy)
    if facts.needs_threshold and dep.kind != "prfaas-pd":
        # no threshold is planned there, and the policy would fail every decision for want of one
        raise UserError(
            f"policy {policy!r} routes by a threshold and runs on a prfaas-pd deployment; "
            f"deployment {name!r} is {dep.kind} (pick a policy for it, e.g. {dep.kind!r})"
        )
    if opts.shaper is not None:
        if dep.prfaas is None:
            raise UserError(
                f"--shaper {opts.shaper}: deployment {name!r} has no cross-datacenter link"
            )
        dep = dep.model_copy(update={"link": dep.link.model_copy(update={"shaper": opts.shaper})})
    if where.preflight is not None:  # what the substrate cannot run, said now (the sim's)
        load_attr(where.preflight)(name, dep)
    t_cfg = scenario.policy.threshold
    # A fixed threshold is the operating point the run has: plan the PD split and lambda_max
    # (what `load` is a fraction of) for it, not for the threshold the search would pick.
    fixed_t = float(t_cfg) if t_cfg != "auto" and get_policy(policy).needs_threshold else None
    plan = plan_deployment(name, dep, plan_inputs(scenario), threshold_tokens=fixed_t)
    n_local = dep.local.instances
    if dep.kind == "naive":
        n_prefill, n_decode = 0, n_local
    elif dep.local.pinned_prefill is not None:
        n_prefill = dep.local.pinned_prefill
        n_decode = n_local - n_prefill
    else:
        n_prefill, n_decode = plan.n_prefill, plan.n_decode
    if get_policy(policy).needs_threshold:
        t = scenario.policy.threshold
        threshold = plan.threshold_tokens if t == "auto" else float(t)
    else:
        threshold = None
    rate = scenario.workload.arrivals.rate_for(plan.lambda_max_rps)
    duration = opts.duration_s if opts.duration_s is not None else scenario.duration
    # Before any process starts: a fault or a checker this run cannot exercise is an error now,
    # not two failed (or vacuous) checkers afterwards.
    check_timeline_fits(scenario, duration)
    checkers_fit(scenario, duration)
    shift_plan: StagePlan | None = None
    shift_rate: float | None = None
    shift = scenario.workload.shift
    if shift is not None:
        shifted = dataclasses.replace(
            plan_inputs(scenario), lengths=length_distribution(shift.lengths)
        )
        shift_plan = plan_deployment(name, dep, shifted)
        if shift.rate is not None:
            shift_rate = shift.rate
        else:
            assert shift.load is not None  # ShiftConfig requires one of them
            shift_rate = shift.load * shift_plan.lambda_max_rps
    check_request_count(scenario, rate, shift_rate, duration, opts.max_requests)
    requests = generate_requests(
        scenario.workload,
        rate_rps=rate,
        duration_s=duration,
        seed=scenario.seed,
        trace_path=opts.trace,
        shift_rate_rps=shift_rate,
    )
    check_requests_made(scenario, requests, rate, duration, opts.max_requests)
    requests = burst_requests(scenario, requests, rate, duration)
    calibration: dict[str, Any] | None = None
    if dep.engine == "torch":  # before any process starts: one clear line, not a crashed worker
        if not where.torch_engine:
            raise UserError(
                f"engine: torch runs on the local substrate only (the {opts.substrate} images "
                "carry no torch); use --substrate local"
            )
        live.check_live_run([(r.id, r.input_tokens, r.output_tokens) for r in requests])
        scale, calibration = live.resolve_time_scale(
            scenario.scale, dep, scenario.slo.tpot, threshold, requests
        )
        scenario = scenario.model_copy(update={"scale": scale})
    elif scenario.scale.auto:
        raise UserError(
            "scale.time_scale: auto applies to engine: torch only (it calibrates the tiny "
            "model's compute on this host); give a number"
        )
    layout = _layout(scenario, dep, policy, n_prefill, n_decode, threshold, plan, shift_plan)
    faults = plan_faults(scenario, layout.workers, link_enabled=dep.prfaas is not None)
    if where.link_verbs is not None:  # a fault this substrate's link cannot play: now, one line
        refuse_unplayable(faults, load_attr(where.link_verbs))
    rp = RunPlan(
        scenario, name, dep, policy, plan, threshold, n_prefill, n_decode, rate, duration,
        requests, layout,
    )  # fmt: skip
    rp.faults = faults
    rp.calibration = calibration
    rp.shift_plan, rp.shift_rate_rps = shift_plan, shift_rate
    if dep.prfaas is not None:  # last: a tc preflight touches the kernel
        rp.shaper_note = preflight_shaper(opts.substrate, dep.link)
    return rp


def _layout(
    scenario: Scenario,
    dep: DeploymentConfig,
    policy: str,
    n_prefill: int,
    n_decode: int,
    threshold: float | None,
    plan: StagePlan,
    shift_plan: StagePlan | None,
) -> Layout:
    """The run's instances, loops and starting events (testbed.substrate.layout), decided
    here once for every substrate."""
    facts = get_policy(policy)
    link = dep.prfaas is not None
    switchable = facts.long_term and link and dep.engine == "emulated"
    scheduler: SchedulerSpec | None = None
    # the loops run for a policy that re-plans, and to measure the link for one that reads it
    if facts.replans or (measures_link(facts) and link):
        scheduler = SchedulerSpec(
            deployment=dep,
            lengths=scenario.workload.lengths,
            output_tokens=scenario.workload.output_tokens,
            tpot_slo_s=scenario.slo.tpot,
            threshold_step=scenario.planner.threshold_step,
            n_prefill=n_prefill,
            short_term=scenario.policy.short_term,
            long_term=scenario.policy.long_term if switchable else None,
            n_local=dep.local.instances,
            replans=facts.replans,
        )
    shift = scenario.workload.shift
    return Layout(
        prfaas_prefill=group_ids("prfaas-prefill", dep.prfaas.instances if dep.prfaas else 0),
        local_prefill=group_ids("local-prefill", n_prefill),
        local_decode=group_ids("local-decode", n_decode),
        switchable=switchable,
        scheduler=scheduler,
        threshold_tokens=threshold,
        plan_event={
            "lambda_max_rps": plan.lambda_max_rps,
            "n_prefill": n_prefill,
            "n_decode": n_decode,
            "shift_at": shift.at if shift is not None else None,
            "shift_lambda_max_rps": shift_plan.lambda_max_rps if shift_plan else None,
            "shift_n_prefill": shift_plan.n_prefill if shift_plan else None,
        },
    )
