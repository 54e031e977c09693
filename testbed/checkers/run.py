"""Running a scenario's checkers after a run, and refusing before it the ones it cannot answer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from testbed.checkers.base import CHECKERS, CheckerConfig, CheckInput, TokenReference
from testbed.checkers.invariants import (
    check_generator_count,
    check_kv_accounted,
    check_no_unverified_decode,
    check_nothing_lost,
)
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
    """The built-in checkers, in a fixed order, then the scenario's own in its order; byte totals
    in their messages are real-world (wire bytes x `byte_scale`), as in the report."""
    out = [
        check_nothing_lost(records, submitted_ids),
        check_kv_accounted(records, byte_scale),
        check_no_unverified_decode(records),
    ]
    if planned is not None:
        out.append(check_generator_count(planned, submitted_ids))
    out += [run_checker(c, records, history, len(submitted_ids), reference) for c in configs]
    return out
