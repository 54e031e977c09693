"""A grid of runs, declared: scenario x `--set` paths x policies x seeds, on one substrate.

Every variant of the scenario is written as `--set` settings (dotted path, YAML value) and
validated exactly as `testbed run --set` and `testbed sweep --set` validate them
(testbed.scenario.sweep.cell_scenario): units required, errors naming the setting. A bench that
wants "the paper's deployment at 120% of lambda_max with uniform arrivals" writes
`{"workload.arrivals.load": 1.2, "workload.arrivals.process": "uniform"}`, not a pydantic
`model_copy` that nothing validates.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

import yaml

from testbed.errors import UserError
from testbed.scenario.library import resolve_scenario
from testbed.scenario.schema import Scenario
from testbed.scenario.sweep import MAX_CELLS, Cell, cell_scenario

__all__ = ["SUBSTRATES", "Grid", "Setting", "Substrate", "setting_text", "settings_of"]

Substrate = Literal["sim", "local", "compose"]
SUBSTRATES: tuple[str, ...] = get_args(Substrate)
"""Where an experiment's runs go: the sim (cells may run in parallel) or live, on local
processes or Docker Compose (one at a time: they share the machine's cores and the measurement
would too)."""

Setting = tuple[str, str]
"""(dotted path, YAML value): one `--set path=value`."""

Value = str | int | float | bool | None | Sequence[object] | Mapping[str, object]


def setting_text(value: Value) -> str:
    """A Python value as the YAML text `--set` takes: `None` -> `null`, `1.2` -> `1.2`, a string
    as written (`10Gbps`, `600s`, `prfaas-static`), a list or mapping in flow style."""
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, bool | int | float):
        return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
    plain = dict(value) if isinstance(value, Mapping) else list(value)
    return yaml.safe_dump(plain, default_flow_style=True).strip()


def settings_of(values: Mapping[str, Value]) -> tuple[Setting, ...]:
    """`{path: value}` as settings, in the mapping's order."""
    return tuple((path, setting_text(v)) for path, v in values.items())


@dataclass(frozen=True)
class Grid:
    """The runs of an experiment: the product of `cases`, `axes`, `policies` and `seeds`, each
    with `fixed` written in first. A case is a bundle of settings that go together (a deployment
    and the policy it runs: `{"deployment": "naive", "policy.name": "naive"}`). An empty
    `cases`, `policies` or `seeds` keeps the scenario's own."""

    scenario: str
    """A scenario file or a library name (`paper`, `bandwidth-drop`)."""
    fixed: tuple[Setting, ...] = ()
    axes: tuple[tuple[str, tuple[str, ...]], ...] = ()
    policies: tuple[str, ...] = ()
    seeds: tuple[int, ...] = ()
    substrate: Substrate = "sim"
    max_requests: int | None = field(default=None, kw_only=True)
    cases: tuple[tuple[Setting, ...], ...] = field(default=(), kw_only=True)

    @classmethod
    def of(
        cls,
        scenario: str | Path,
        *,
        fixed: Mapping[str, Value] | None = None,
        cases: Sequence[Mapping[str, Value]] = (),
        axes: Mapping[str, Sequence[Value]] | None = None,
        policies: Sequence[str] = (),
        seeds: Sequence[int] = (),
        substrate: Substrate = "sim",
        max_requests: int | None = None,
    ) -> Grid:
        """A grid from Python values (each written as `--set` text by `setting_text`)."""
        return cls(
            str(scenario),
            settings_of(fixed or {}),
            tuple((p, tuple(setting_text(v) for v in vs)) for p, vs in (axes or {}).items()),
            tuple(policies),
            tuple(seeds),
            substrate,
            max_requests=max_requests,
            cases=tuple(settings_of(c) for c in cases),
        )

    def with_fixed(self, values: Mapping[str, Value]) -> Grid:
        """This grid with `values` written after its own fixed settings (a later one wins)."""
        return dataclasses.replace(self, fixed=(*self.fixed, *settings_of(values)))

    @property
    def path(self) -> Path:
        return resolve_scenario(self.scenario)

    def settings(self) -> list[tuple[Setting, ...]]:
        """Each run's settings, in grid order: fixed, the case, the axes, the policy, the seed."""
        if self.substrate not in SUBSTRATES:
            raise UserError(f"substrate {self.substrate!r}: an experiment runs on {SUBSTRATES}")
        axes: list[tuple[str, tuple[str, ...]]] = list(self.axes)
        if self.policies:
            axes.append(("policy.name", self.policies))
        if self.seeds:
            axes.append(("seed", tuple(str(s) for s in self.seeds)))
        case_paths = {p for case in self.cases for p, _ in case}
        paths = [p for p, _ in self.fixed] + [p for p, _ in axes] + sorted(case_paths)
        if len(set(paths)) != len(paths):
            raise UserError(f"{self.scenario}: each path may be set once in a grid ({paths})")
        cases: tuple[tuple[Setting, ...], ...] = self.cases or ((),)
        grid = list(itertools.product(*(vs for _, vs in axes)))
        if len(grid) * len(cases) > MAX_CELLS:
            raise UserError(
                f"{len(grid) * len(cases)} runs; an experiment takes at most {MAX_CELLS}"
            )
        names = [p for p, _ in axes]
        return [
            (*self.fixed, *case, *zip(names, values, strict=True))
            for case in cases
            for values in grid
        ]

    def cells(self) -> list[Cell]:
        """The grid as the sweep's cells (no saturation run: a measure asks for what it needs)."""
        path = str(self.path)
        return [
            Cell(path, s, saturation=False, max_requests=self.max_requests) for s in self.settings()
        ]

    def scenario_of(self, settings: Sequence[Setting] = ()) -> Scenario:
        """The scenario with `fixed` and `settings` written in, validated as `--set` is."""
        return cell_scenario(Cell(str(self.path), (*self.fixed, *settings), saturation=False))
