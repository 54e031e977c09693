"""`testbed hindsight`: the best fixed setting of a scenario, chosen knowing the whole run.

A yardstick that is achievable by construction (issue #18): on the sim, `prfaas-static` runs the
scenario at each threshold of a grid (log-spaced around the planner's t) and, where the
deployment has a local PD cluster, at each PD split of a grid (same total), fixed over the whole
run, for every seed; the best setting by the objective (its mean over the seeds) is what a policy
that does not know the future should come close to, and what one that adapts should beat where
conditions change mid-run.

Objectives:
- `ttft-p90-fault`: P90 TTFT over the requests that arrived in the fault window (first fault
  start to last fault end; the whole run without faults), a failed request counting as infinite
  (testbed.metrics.scorecard), lower is better;
- `goodput`: goodput at the SLO over the run, higher is better.

Every setting is offered the same requests: the arrival rate is the one the scenario offers
under its own threshold search (`load` x the planner's lambda_max), written into each cell as a
fixed `rate`, so a threshold or a split does not change the load it is judged under (a fixed
threshold would otherwise re-plan lambda_max, and with it `load`'s rate).

It is a preset of `testbed sweep`: each setting and seed is a sweep `Cell` (the settings written
into the scenario file and validated like it), run by the sweep's process pool
(`testbed.scenario.sweep.run_grid`) with `run_fixed` as the cell function.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from testbed.clock import Scale
from testbed.errors import UserError
from testbed.metrics.scorecard import fault_window, mean_rows, run_row
from testbed.scenario.library import resolve_scenario
from testbed.scenario.plan import RunOptions, RunPlan, prepare_run
from testbed.scenario.schema import Scenario, load_scenario
from testbed.scenario.sim_run import sim_inputs
from testbed.scenario.sweep import Cell, cell_scenario, run_grid, sim_options
from testbed.sim import simulate

__all__ = [
    "OBJECTIVES",
    "HindsightPlan",
    "HindsightResult",
    "Objective",
    "best_fixed",
    "default_splits",
    "default_thresholds",
    "measure_sim",
    "plan_hindsight",
    "run_fixed",
]

Objective = Literal["ttft-p90-fault", "goodput"]
OBJECTIVES: tuple[str, ...] = get_args(Objective)
OBJECTIVE_TEXT = {
    "ttft-p90-fault": "P90 TTFT over the fault window, lower is better",
    "goodput": "goodput at the SLO over the run, higher is better",
}
THRESHOLD_FACTORS = tuple(2 ** (k / 2) for k in range(-4, 4))
"""The default grid: the planner's t times 1/4 ... 2.83 in steps of sqrt(2) (8 values): from
offloading most prompts to keeping all but the longest local."""
POLICY = "prfaas-static"
MAX_SETTINGS = 400


def plan_row(
    rp: RunPlan, records: list[Any], history: list[Any], checks: list[Any]
) -> dict[str, Any]:
    """The scorecard's row of one run of `rp` (testbed.metrics.scorecard.run_row), its fault
    window and units taken from the plan: what the sim and live measurements share."""
    sc = rp.scenario
    return run_row(
        records,
        history,
        checks,
        duration_s=rp.duration_s,
        slo=sc.slo,
        scale=Scale.of(sc.scale),
        window=fault_window(rp.faults, rp.duration_s),
    )


def measure_sim(
    scenario: Scenario, policy: str | None = None, max_requests: int | None = None
) -> tuple[RunPlan, dict[str, Any], list[Any]]:
    """Simulate `scenario` (with `policy`, resolved as `testbed run --policy` does) and measure
    it: the plan, the run's row (testbed.metrics.scorecard.run_row) and its checker results."""
    from testbed.checkers import run_checkers

    opts = sim_options(policy, max_requests)
    rp = prepare_run(scenario, opts)
    out = simulate(sim_inputs(rp, opts))
    sc = rp.scenario
    checks = run_checkers(
        out.records,
        out.submitted,
        history=out.history,
        configs=sc.checkers,
        planned=len(rp.requests),
        byte_scale=sc.scale.byte_scale,
    )
    row = plan_row(rp, out.records, out.history, checks)
    row.update(
        {
            "policy": rp.policy,
            "seed": sc.seed,
            "threshold_tokens": rp.threshold_tokens,
            "n_prefill": rp.n_prefill,
            "n_decode": rp.n_decode,
            "offered_rps": rp.rate_rps,
        }
    )
    return rp, row, checks


def run_fixed(cell: Cell) -> dict[str, Any]:
    """One setting and seed of a hindsight sweep (the sweep's cell function)."""
    _, row, _ = measure_sim(cell_scenario(cell), max_requests=cell.max_requests)
    return {**dict(cell.settings), **row}


@dataclass
class HindsightResult:
    """The sweep's rows (per setting and seed), the means per setting and the best one."""

    scenario: str
    objective: Objective
    seeds: tuple[int, ...]
    window_s: tuple[float, float]
    offered_rps: float | None
    planner_threshold_tokens: float
    planner_split: tuple[int, int]
    rows: list[dict[str, Any]]
    settings: list[dict[str, Any]]
    best: dict[str, Any]
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "objective": self.objective,
            "objective_text": OBJECTIVE_TEXT[self.objective],
            "seeds": list(self.seeds),
            "window_s": list(self.window_s),
            "offered_rps": self.offered_rps,
            "planner_threshold_tokens": self.planner_threshold_tokens,
            "planner_split": list(self.planner_split),
            "rows": self.rows,
            "settings": self.settings,
            "best": self.best,
            "wall_s": self.wall_s,
            "notes": self.notes,
        }


def default_thresholds(planner_t: float) -> list[float]:
    return sorted({float(round(planner_t * f)) for f in THRESHOLD_FACTORS if planner_t * f >= 1})


def default_splits(n_local: int, n_prefill: int) -> list[int]:
    """The running PD-P count and one either side (each role keeps at least one instance)."""
    return [p for p in (n_prefill - 1, n_prefill, n_prefill + 1) if 1 <= p <= n_local - 1]


def objective_value(setting: dict[str, Any], objective: Objective) -> float:
    """The setting's figure for `objective`, as a cost (lower is better; a missing or infinite
    figure is +inf)."""
    if objective == "goodput":
        v = setting.get("goodput_rps")
        return -v if v is not None else math.inf
    v = setting.get("ttft_p90_window_s")
    return v if v is not None else math.inf


def _rank(setting: dict[str, Any], objective: Objective) -> tuple[float, float]:
    """Objective first; ties go to the other figure (goodput for TTFT, P90 TTFT for goodput)."""
    other: Objective = "goodput" if objective == "ttft-p90-fault" else "ttft-p90-fault"
    return objective_value(setting, objective), objective_value(setting, other)


@dataclass
class HindsightPlan:
    """A hindsight sweep before it runs: its cells, and what its result needs besides rows."""

    scenario: str
    objective: Objective
    seeds: tuple[int, ...]
    window_s: tuple[float, float]
    offered_rps: float | None
    planner_threshold_tokens: float
    planner_split: tuple[int, int]
    cells: list[Cell]

    def result(self, rows: Sequence[dict[str, Any]], wall_s: float = 0.0) -> HindsightResult:
        """The means per setting (threshold, split) over the seeds, and the best one."""
        groups: dict[tuple[float, int], list[dict[str, Any]]] = {}
        for r in rows:
            groups.setdefault((float(r["threshold_tokens"]), int(r["n_prefill"])), []).append(r)
        settings: list[dict[str, Any]] = []
        for (t, p), rs in sorted(groups.items()):
            m = mean_rows(rs)
            m.update(
                {
                    "key": f"t={t:.0f},p={p}",
                    "threshold_tokens": t,
                    "n_prefill": p,
                    "n_decode": int(rs[0]["n_decode"]),
                }
            )
            cost = objective_value(m, self.objective)
            m["objective_value"] = None if math.isinf(cost) else abs(cost)
            settings.append(m)
        if not settings:
            raise UserError(f"hindsight {self.scenario}: no setting ran")
        best = min(settings, key=lambda s: _rank(s, self.objective))
        return HindsightResult(
            self.scenario,
            self.objective,
            self.seeds,
            self.window_s,
            self.offered_rps,
            self.planner_threshold_tokens,
            self.planner_split,
            list(rows),
            settings,
            best,
            wall_s,
        )


def plan_hindsight(
    scenario: str | Path,
    seeds: Sequence[int],
    objective: Objective,
    *,
    thresholds: Sequence[float] | None = None,
    splits: Sequence[int] | None = None,
    sweep_split: bool = True,
    overrides: Sequence[tuple[str, str]] = (),
    max_requests: int | None = None,
) -> HindsightPlan:
    """The cells of a hindsight sweep of `scenario` (a file or a library name).

    `thresholds` default to `default_thresholds` around the planner's t (the scenario's own t
    when it fixes one); `splits` (PD-P counts) to `default_splits` around the running split when
    `sweep_split`, else the running split only. `overrides` are (path, value) settings written
    into the scenario first, as `testbed sweep --set` writes them (e.g. ("deployment", NAME)).
    `max_requests`: the cap on the requests each run plans (None: the default cap)."""
    if objective not in OBJECTIVES:
        raise UserError(f"objective {objective!r}: use one of {', '.join(OBJECTIVES)}")
    if not seeds:
        raise UserError("hindsight needs at least one seed")
    path = resolve_scenario(str(scenario))
    sc = cell_scenario(Cell(str(path), tuple(overrides))) if overrides else load_scenario(path)
    opts = RunOptions(substrate="sim", policy=POLICY, progress=False, max_requests=max_requests)
    rp = prepare_run(sc, opts)
    dep = rp.deployment
    if dep.kind != "prfaas-pd":
        raise UserError(
            f"hindsight {path.stem}: sweeps a PrfaaS threshold, and deployment "
            f"{rp.deployment_name!r} is {dep.kind} (it needs a prfaas-pd deployment)"
        )
    assert rp.threshold_tokens is not None  # prfaas-static on prfaas-pd always has one
    n_local = dep.local.instances
    ts = sorted({float(t) for t in thresholds}) if thresholds else None
    ts = ts or default_thresholds(rp.threshold_tokens)
    if any(t < 1 for t in ts):
        raise UserError("--thresholds: a threshold is a positive token count")
    if splits:
        ps = sorted(set(splits))
        bad = [p for p in ps if not 1 <= p <= n_local - 1]
        if bad:
            raise UserError(
                f"--splits {bad[0]}: the local cluster has {n_local} instances; a split keeps "
                f"1 to {n_local - 1} of them on prefill"
            )
    elif sweep_split:
        ps = default_splits(n_local, rp.n_prefill)
    else:
        ps = [rp.n_prefill]
    if len(ts) * len(ps) > MAX_SETTINGS:
        raise UserError(f"{len(ts) * len(ps)} settings; hindsight takes at most {MAX_SETTINGS}")
    common: list[tuple[str, str]] = [
        *overrides,
        ("policy.name", POLICY),
        ("deployment", rp.deployment_name),
    ]
    if rp.rate_rps is not None:
        common += [
            ("workload.arrivals.rate", repr(rp.rate_rps)),
            ("workload.arrivals.load", "null"),
        ]
    if rp.shift_rate_rps is not None:
        common += [
            ("workload.shift.rate", repr(rp.shift_rate_rps)),
            ("workload.shift.load", "null"),
        ]
    local = f"deployments.{rp.deployment_name}.local"

    def split(p: int) -> tuple[tuple[str, str], ...]:
        # always written: a fixed threshold re-plans the split otherwise. (For a scenario with
        # a `workload.shift`, a pinned split also pins the planner's plan after the shift,
        # which the throughput checker judges against; the runs themselves are the same.)
        return ((f"{local}.prefill", str(p)), (f"{local}.decode", str(n_local - p)))

    todo = [
        Cell(
            str(path),
            (*common, ("policy.threshold", f"{t:.0f}"), *split(p), ("seed", str(seed))),
            saturation=False,
            max_requests=max_requests,
        )
        for t in ts
        for p in ps
        for seed in seeds
    ]
    return HindsightPlan(
        path.stem,
        objective,
        tuple(seeds),
        fault_window(rp.faults, rp.duration_s),
        rp.rate_rps,
        rp.threshold_tokens,
        (rp.n_prefill, rp.n_decode),
        todo,
    )


def best_fixed(
    scenario: str | Path,
    seeds: Sequence[int],
    objective: Objective,
    *,
    thresholds: Sequence[float] | None = None,
    splits: Sequence[int] | None = None,
    sweep_split: bool = True,
    jobs: int | None = None,
    on_row: Callable[[int, dict[str, Any]], None] | None = None,
    overrides: Sequence[tuple[str, str]] = (),
    max_requests: int | None = None,
) -> HindsightResult:
    """The best fixed threshold (and PD split) for `scenario` in hindsight, on the sim (see the
    module docstring); what the scorecard's reference row and the predictive policy's
    acceptance compare against."""
    import time

    started = time.perf_counter()
    hp = plan_hindsight(
        scenario,
        seeds,
        objective,
        thresholds=thresholds,
        splits=splits,
        sweep_split=sweep_split,
        overrides=overrides,
        max_requests=max_requests,
    )
    n_jobs = jobs or min(len(hp.cells), os.cpu_count() or 1)
    rows = run_grid(hp.cells, jobs=n_jobs, on_row=on_row, fn=run_fixed)
    return hp.result(rows, time.perf_counter() - started)
