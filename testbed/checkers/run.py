"""Running a scenario's checkers after a run, and refusing before it the ones it cannot answer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from testbed.checkers.base import CHECKERS, CheckerConfig, CheckInput, TokenReference
from testbed.checkers.invariants import INVARIANTS
from testbed.checkers.result import CheckResult
from testbed.errors import UserError
from testbed.metrics.records import HistoryEvent, RequestRecord
from testbed.nemesis import NemesisEvent

__all__ = ["CheckedScenario", "checkers_fit", "run_checker", "run_checkers"]


class CheckedScenario(Protocol):
    """What `checkers_fit` reads of a scenario (testbed.scenario.schema.Scenario)."""

    @property
    def name(self) -> str: ...

    @property
    def nemesis(self) -> Sequence[NemesisEvent]: ...

    @property
    def checkers(self) -> Sequence[CheckerConfig]: ...


def checkers_fit(scenario: CheckedScenario, duration_s: float) -> None:
    """Refuse, before anything starts, a checker that this run could only judge vacuously or
    fail for a reason that has nothing to do with the service: one about a fault the timeline
    does not have, `recover` from a fault that never ends, or a throughput window that ends
    after the arrivals do (each checker's `problems`). Faults past the duration:
    testbed.nemesis.check_timeline_fits."""
    problems = [
        f"checkers.{i} ({c.check}) {problem}"
        for i, c in enumerate(scenario.checkers)
        for problem in c.problems(scenario.nemesis, duration_s)
    ]
    if problems:
        raise UserError(f"scenario {scenario.name!r}: " + "; ".join(problems))


def run_checker(
    cfg: CheckerConfig,
    records: Sequence[RequestRecord],
    history: Sequence[HistoryEvent],
    submitted: int,
    reference: TokenReference | None = None,
) -> CheckResult:
    """One scenario checker (`checkers:` in a scenario file), by its registered function."""
    return CHECKERS[cfg.check].run(cfg, CheckInput(records, history, submitted, reference))


def run_checkers(
    records: Sequence[RequestRecord],
    submitted_ids: Sequence[str],
    *,
    history: Sequence[HistoryEvent] = (),
    configs: Sequence[CheckerConfig] = (),
    planned: int | None = None,
    reference: TokenReference | None = None,
    byte_scale: float = 1.0,
) -> list[CheckResult]:
    """The built-in invariants, in a fixed order, then the scenario's own checkers in its order,
    each called as `(config, run)`; byte totals in their messages are real-world (wire bytes x
    `byte_scale`), as in the report."""
    run = CheckInput(
        records, history, len(submitted_ids), reference, submitted_ids, planned, byte_scale
    )
    out = []
    for inv in INVARIANTS:
        cfg = inv.config()
        if cfg.applies(run):
            out.append(inv.run(cfg, run))
    out += [CHECKERS[c.check].run(c, run) for c in configs if c.applies(run)]
    return out
