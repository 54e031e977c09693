"""`testbed sweep`: a grid of what-ifs on the sim substrate, one row per cell.

Each `--set path=v1,v2,...` names a field by its path in the scenario file
(`deployments.prfaas-pd.link.bandwidth`, `workload.arrivals.load`, `policy.name`, `seed`) and the
values it takes; the grid is their product. A cell is the scenario file with those values written
in, validated like the file itself (units required, errors naming the `--set`), then simulated
twice: as the scenario offers it (goodput, TTFT, SLO attainment, link use), and at 120% of the
planner's lambda_max, where the completion rate over the steady window is the cell's saturation
throughput (the method of bench/fidelity.py), set next to the planner's lambda_max. Cells where
the two differ by more than FLAG_GAP are flagged: the planner's fluid model leaves something out
there (docs/sim.md says what, by bottleneck).

Cells run in a local process pool (`jobs`), or on a Ray cluster; either way each cell is one
call of `run_cell`, a pure function of its inputs, so the results are identical.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import yaml

from testbed.clock import Scale
from testbed.config import load_yaml
from testbed.errors import ConfigError, UserError
from testbed.metrics.records import HistoryEvent, RequestRecord
from testbed.metrics.summary import summarize
from testbed.metrics.window import completion_rate, steady_window
from testbed.scenario.plan import RunOptions, RunPlan, prepare_run
from testbed.scenario.schema import Scenario, scenario_from_data
from testbed.scenario.sim_run import sim_inputs
from testbed.sim import simulate

__all__ = [
    "FLAG_GAP",
    "Axis",
    "Cell",
    "cells",
    "map_cells",
    "parse_set",
    "parse_setting",
    "plan_summary",
    "run_cell",
    "run_grid",
    "scenario_with_settings",
    "sim_options",
]

FLAG_GAP = 0.10
"""Sim saturation vs the planner's lambda_max beyond which a cell is flagged."""
SATURATION_LOAD = 1.2
SATURATION_MIN_S = 600.0
"""Real-world seconds a saturation run lasts at least: its steady window (the last five sixths)
must dwarf the time a request spends in the system (~25 s on the paper's workload), or the
ramp-up reads as lost throughput (-10% at 120 s on the paper's deployment, -2.7% at 600 s)."""
MAX_CELLS = 10_000
R = TypeVar("R")


@dataclass(frozen=True)
class Axis:
    path: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class Cell:
    """One point of the grid: the scenario file and the values written into it."""

    scenario_path: str
    settings: tuple[tuple[str, str], ...]
    saturation: bool = True
    max_requests: int | None = field(default=None, kw_only=True)
    """The cap on the requests its runs plan (`--max-requests`; None: the default cap)."""


def _path_and_value(text: str, form: str) -> tuple[str, str]:
    """`path=...` split at the first `=`, the path checked to be dotted; `form` is what the
    error shows as the right way to write it."""
    path, sep, value = text.partition("=")
    path, value = path.strip(), value.strip()
    if not sep or not path or not value:
        raise UserError(f"--set {text!r}: write it as {form}")
    if any(not part for part in path.split(".")):
        raise UserError(f"--set {text!r}: {path!r} is not a dotted path")
    return path, value


def parse_set(text: str) -> Axis:
    """`path=v1,v2,...` (values as YAML scalars: `10Gbps`, `4`, `prfaas-static`)."""
    path, values = _path_and_value(text, "path=value1,value2,...")
    vals = tuple(v.strip() for v in values.split(","))
    if any(not v for v in vals):
        raise UserError(f"--set {text!r}: an empty value")
    if len(set(vals)) != len(vals):
        raise UserError(f"--set {text!r}: a value given twice")
    return Axis(path, vals)


def parse_setting(text: str) -> tuple[str, str]:
    """`path=value` of `testbed run --set` and `testbed hindsight --set`: one value, written as
    YAML (`1.0`, `10Gbps`, `[]`, `{name: prfaas}`; commas belong to the value)."""
    return _path_and_value(text, "path=value, e.g. workload.arrivals.load=1.0")


def scenario_with_settings(scenario_path: Path, settings: Sequence[tuple[str, str]]) -> Scenario:
    """The scenario file with each (path, value) written in, validated like the file: what
    `testbed run --set` runs. Errors name the file, the field and the settings."""
    paths = [p for p, _ in settings]
    if len(set(paths)) != len(paths):
        raise UserError("each path may be --set once")
    return cell_scenario(Cell(str(scenario_path), tuple(settings), saturation=False))


def cells(
    scenario_path: Path,
    axes: Sequence[Axis],
    *,
    saturation: bool = True,
    max_requests: int | None = None,
) -> list[Cell]:
    paths = [a.path for a in axes]
    if len(set(paths)) != len(paths):
        raise UserError("each path may be --set once")
    grid = list(itertools.product(*(a.values for a in axes)))
    if len(grid) > MAX_CELLS:
        raise UserError(f"{len(grid)} cells; a sweep takes at most {MAX_CELLS}")
    return [
        Cell(
            str(scenario_path),
            tuple(zip(paths, values, strict=True)),
            saturation,
            max_requests=max_requests,
        )
        for values in grid
    ]


def _write(data: dict[str, Any], path: str, raw: str) -> None:
    """Write `raw` (a YAML scalar) at the dotted `path`, creating mappings on the way.

    A name with dots in it (a deployment called `minimax-m2.5`) is one step where the mapping
    already holds that name: at each mapping the longest run of parts that is one of its keys
    is taken first."""
    value = yaml.safe_load(raw)
    node: Any = data
    parts = path.split(".")
    i = 0
    for _ in parts:  # each step takes at least one part
        if isinstance(node, dict):
            n = next(
                (n for n in range(len(parts) - i, 1, -1) if ".".join(parts[i : i + n]) in node), 1
            )
            part = ".".join(parts[i : i + n])
        else:
            n, part = 1, parts[i]
        i += n
        if i == len(parts):
            break
        if isinstance(node, list):
            node = node[_index(part, node, path)]
        elif isinstance(node, dict):
            node = node.setdefault(part, {})
        else:
            raise UserError(f"--set {path}: {part!r} is inside a value, not a mapping")
    if isinstance(node, list):
        node[_index(part, node, path)] = value
    elif isinstance(node, dict):
        node[part] = value
    else:
        raise UserError(f"--set {path}: {part!r} is inside a value, not a mapping")


def _index(part: str, node: list[Any], path: str) -> int:
    if not part.isdigit() or int(part) >= len(node):
        raise UserError(f"--set {path}: {part!r} is not an index of a list of {len(node)}")
    return int(part)


def cell_scenario(cell: Cell, base: dict[str, Any] | None = None) -> Scenario:
    """The scenario of one cell, validated like the file (errors name the settings)."""
    path = Path(cell.scenario_path)
    data = copy.deepcopy(base) if base is not None else load_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of scenario fields at the top level")
    for key, raw in cell.settings:
        _write(data, key, raw)
    try:
        return scenario_from_data(data, path)
    except ConfigError as exc:
        shown = ", ".join(f"{k}={v}" for k, v in cell.settings)
        raise UserError(f"{exc} (with --set {shown})") from None


def sim_options(policy: str | None = None, max_requests: int | None = None) -> RunOptions:
    """The options of a sim run whose results stay in memory (no output directory written)."""
    return RunOptions(
        substrate="sim",
        policy=policy,
        out_dir=Path("unused"),
        progress=False,
        max_requests=max_requests,
    )


def plan_summary(
    rp: RunPlan, records: list[RequestRecord], history: list[HistoryEvent]
) -> dict[str, Any]:
    """summary.json's figures of a run of `rp` (its duration, SLO and scale)."""
    sc = rp.scenario
    return summarize(
        records, history, duration_s=rp.duration_s, slo=sc.slo, scale=Scale.of(sc.scale)
    )


def simulate_scenario(
    scenario: Scenario, max_requests: int | None = None
) -> tuple[Any, dict[str, Any], list[RequestRecord]]:
    opts = sim_options(max_requests=max_requests)
    rp = prepare_run(scenario, opts)
    out = simulate(sim_inputs(rp, opts))
    return rp, plan_summary(rp, out.records, out.history), out.records


def saturation_cell(cell: Cell, duration_s: float) -> Cell:
    """`cell` offered SATURATION_LOAD x the planner's lambda_max for at least SATURATION_MIN_S,
    without faults or checkers: written as settings, validated like the file."""
    extra = (
        ("workload.arrivals.rate", "null"),
        ("workload.arrivals.load", repr(SATURATION_LOAD)),
        ("duration", f"{max(duration_s, SATURATION_MIN_S)!r}s"),
        ("nemesis", "[]"),
        ("checkers", "[]"),
    )
    return Cell(
        cell.scenario_path,
        (*cell.settings, *extra),
        saturation=False,
        max_requests=cell.max_requests,
    )


def run_cell(cell: Cell) -> dict[str, Any]:
    """Simulate one cell (and its saturation run); a row of the sweep's table."""
    scenario = cell_scenario(cell)
    rp, s, _ = simulate_scenario(scenario, cell.max_requests)
    plan = rp.plan
    row: dict[str, Any] = dict(cell.settings)
    row.update(
        {
            "policy": rp.policy,
            "gpus": plan.gpus,
            "offered_rps": rp.rate_rps,
            "throughput_rps": s["throughput_rps"],
            "goodput_rps": s["goodput_rps"],
            "goodput_per_gpu": s["goodput_rps"] / plan.gpus if plan.gpus else None,
            "ttft_p50_s": s["ttft_s"]["p50"],
            "ttft_p90_s": s["ttft_s"]["p90"],
            "slo_attainment": s["slo_attainment"],
            "failed": s["requests"]["failed"],
            "link_mean_gbps": s["link"].get("mean_gbps") if s.get("link") else None,
            "planner_lambda_max_rps": plan.lambda_max_rps,
            "planner_bottleneck": plan.bottleneck,
        }
    )
    if cell.saturation:
        sat = cell_scenario(saturation_cell(cell, scenario.duration))
        rp_sat, _, records = simulate_scenario(sat, cell.max_requests)
        rate = completion_rate(records, *steady_window(rp_sat.duration_s))
        gap = rate / plan.lambda_max_rps - 1 if plan.lambda_max_rps else None
        row.update(
            {
                "sim_saturation_rps": rate,
                "saturation_vs_planner": gap,
                "flagged": gap is not None and abs(gap) > FLAG_GAP,
            }
        )
    return row


def run_grid(
    todo: Sequence[Cell],
    *,
    jobs: int = 1,
    ray_address: str | None = None,
    on_row: Callable[[int, dict[str, Any]], None] | None = None,
    fn: Callable[[Cell], dict[str, Any]] = run_cell,
) -> list[dict[str, Any]]:
    """Every cell's row, in grid order, from a process pool or a Ray cluster.

    `fn` makes a cell's row (default `run_cell`); presets of the sweep (`testbed hindsight`,
    `testbed scorecard`) pass their own, a module-level function so a worker can unpickle it."""
    return map_cells(todo, fn, jobs=jobs, ray_address=ray_address, on_row=on_row)


def map_cells(
    todo: Sequence[Cell],
    fn: Callable[[Cell], R],
    *,
    jobs: int = 1,
    ray_address: str | None = None,
    on_row: Callable[[int, R], None] | None = None,
) -> list[R]:
    """`fn` of every cell, in grid order, from a process pool or a Ray cluster: `run_grid` for
    any result type (testbed.experiment's typed rows)."""
    if not todo:
        return []
    cell_scenario(todo[0])  # a bad --set fails here, once, before any worker starts
    if ray_address is not None:
        from testbed.scenario.sweep_ray import run_on_ray

        # run_on_ray is typed for the sweep's dict rows; it returns whatever `fn` returns
        rows = cast(list[R], run_on_ray(todo, ray_address, cast(Callable[[Cell], Any], fn)))
        for i, row in enumerate(rows):
            if on_row is not None:
                on_row(i, row)
        return rows
    results: dict[int, R] = {}
    if jobs <= 1:
        for i, cell in enumerate(todo):
            results[i] = fn(cell)
            if on_row is not None:
                on_row(i, results[i])
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(fn, cell): i for i, cell in enumerate(todo)}
            from concurrent.futures import as_completed

            for fut in as_completed(futures):
                i = futures[fut]
                results[i] = fut.result()
                if on_row is not None:
                    on_row(i, results[i])
    return [results[i] for i in range(len(todo))]
