"""Running a grid: each cell once, through the run path `testbed run` takes, into typed rows.

A `measure` turns one finished run (`Run`: its cell, plan, records, history, summary, checker
results) into the figures a bench tabulates; `run_experiment` returns one `Row` per cell, in grid
order, with the settings that made it. On the sim the cells go to the sweep's process pool or
Ray cluster (testbed.scenario.sweep.map_cells), so `measure` must be a module-level function
(a worker imports it); live runs go one at a time in this process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from testbed.experiment.grid import Grid, Setting, Substrate
from testbed.metrics.records import HistoryEvent, RequestRecord
from testbed.scenario.plan import RunOptions, RunPlan, prepare_run
from testbed.scenario.schema import Scenario
from testbed.scenario.sweep import Cell, cell_scenario, map_cells, plan_summary, sim_options
from testbed.substrates import substrate_facts

__all__ = ["Row", "Run", "run_experiment", "run_scenario_once"]

T = TypeVar("T")


@dataclass
class Run:
    """One finished run of a cell: what a measure reads."""

    settings: tuple[Setting, ...]
    scenario: Scenario
    plan: RunPlan
    records: list[RequestRecord]
    history: list[HistoryEvent]
    summary: dict[str, Any]
    checks: list[Any]

    @property
    def duration_s(self) -> float:
        return self.plan.duration_s

    def setting(self, path: str) -> str | None:
        return dict(self.settings).get(path)

    @property
    def ok(self) -> bool:
        """No checker failed (as `testbed run`'s exit code reads it)."""
        return all(c.verdict != "failed" for c in self.checks)


@dataclass(frozen=True)
class Row(Generic[T]):
    """A cell's settings and what its measure made of the run."""

    settings: tuple[Setting, ...]
    value: T

    def setting(self, path: str) -> str | None:
        return dict(self.settings).get(path)


def run_scenario_once(
    scenario: Scenario,
    substrate: Substrate = "sim",
    *,
    settings: tuple[Setting, ...] = (),
    max_requests: int | None = None,
    checkers: bool = True,
    policy: str | None = None,
    seed: int | None = None,
    duration_s: float | None = None,
    shaper: str | None = None,
    drain_timeout_s: float | None = None,
) -> Run:
    """Run `scenario` once on `substrate` (live: into a temporary directory) and keep it all.

    `policy`, `seed`, `duration_s`, `shaper`, `drain_timeout_s` are `testbed run`'s options of
    those names (`--policy`, `--seed`, `--duration`, `--shaper`; None: the scenario's own)."""
    given = {
        "policy": policy,
        "seed": seed,
        "duration_s": duration_s,
        "shaper": shaper,
        "drain_timeout_s": drain_timeout_s,
    }
    options: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    if substrate_facts(substrate).virtual_time:  # testbed.substrates: the sim
        from testbed.checkers import run_checkers
        from testbed.scenario.sim_run import sim_inputs
        from testbed.sim import simulate

        opts = dataclasses.replace(sim_options(max_requests=max_requests), **options)
        rp = prepare_run(scenario, opts)
        out = simulate(sim_inputs(rp, opts))
        sc = rp.scenario
        summary = plan_summary(rp, out.records, out.history)
        checks = (
            run_checkers(
                out.records,
                out.submitted,
                history=out.history,
                configs=sc.checkers,
                planned=len(rp.requests),
                byte_scale=sc.scale.byte_scale,
            )
            if checkers
            else []
        )
        return Run(settings, scenario, rp, out.records, out.history, summary, checks)
    from testbed.scenario.runner import run_scenario

    with tempfile.TemporaryDirectory() as tmp:
        opts = RunOptions(
            substrate=substrate,
            out_dir=Path(tmp),
            progress=False,
            max_requests=max_requests,
            timeline=False,
            **options,
        )
        rp = prepare_run(scenario, opts)
        result = asyncio.run(run_scenario(rp, opts))
    return Run(
        settings, scenario, rp, result.records, result.history, result.summary, result.checks
    )


def _run_cell(
    measure: Callable[[Run], T], substrate: Substrate, checkers: bool, cell: Cell
) -> Row[T]:
    run = run_scenario_once(
        cell_scenario(cell),
        substrate,
        settings=cell.settings,
        max_requests=cell.max_requests,
        checkers=checkers,
    )
    return Row(cell.settings, measure(run))


def run_experiment(
    grid: Grid,
    measure: Callable[[Run], T],
    *,
    jobs: int = 1,
    ray_address: str | None = None,
    checkers: bool = True,
    on_row: Callable[[int, Row[T]], None] | None = None,
) -> list[Row[T]]:
    """`measure` of every run of `grid`, in grid order (identical for any `jobs`: each cell is a
    pure function of its settings). Live grids run one cell at a time whatever `jobs` says."""
    todo = grid.cells()
    fn = functools.partial(_run_cell, measure, grid.substrate, checkers)
    if not substrate_facts(grid.substrate).virtual_time:  # live: one at a time
        jobs, ray_address = 1, None
    return map_cells(todo, fn, jobs=jobs, ray_address=ray_address, on_row=on_row)
