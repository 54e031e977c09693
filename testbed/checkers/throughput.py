"""throughput: requests completed per second in a window against the planner's optimum.

Requests completed per second (by last token) in [`after`, `until`) is at least `min_fraction`
of the planner's lambda_max for the workload in force at `after` (after a `workload.shift`: the
new optimum, PD split free).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from testbed.checkers.base import CheckerConfig, CheckInput, checker
from testbed.checkers.result import CheckResult, seconds
from testbed.config import Duration, PositiveDuration
from testbed.metrics.records import HistoryEvent, RequestRecord
from testbed.nemesis import NemesisEvent

__all__ = ["ThroughputCheck", "check_throughput"]


class ThroughputCheck(CheckerConfig):
    check: Literal["throughput"] = "throughput"
    after: Duration
    until: PositiveDuration
    min_fraction: float = Field(gt=0)

    def problems(self, nemesis: Sequence[NemesisEvent], duration_s: float) -> list[str]:
        if self.until > duration_s:
            return [f"measures until {self.until:g}s, past the run's duration of {duration_s:g}s"]
        return []


@checker(ThroughputCheck)
def throughput(cfg: ThroughputCheck, run: CheckInput) -> CheckResult:
    return check_throughput(run.records, run.history, cfg.after, cfg.until, cfg.min_fraction)


def check_throughput(
    records: Sequence[RequestRecord],
    history: Sequence[HistoryEvent],
    after: float,
    until: float,
    min_fraction: float,
) -> CheckResult:
    """Completions per second in [after, until] against the planner's lambda_max for the
    workload in force at `after` (the runner records both optima as a "plan" event)."""
    name = f"throughput[{seconds(after)}..{seconds(until)}]"
    plan = next((e.data for e in history if e.kind == "plan"), None)
    if plan is None or until <= after:
        return CheckResult(name, False, "no planner optimum recorded for this run")
    shift_at = plan.get("shift_at")
    key = "shift_lambda_max_rps" if shift_at is not None and after >= shift_at else "lambda_max_rps"
    target = float(plan[key])
    done = sum(
        1
        for r in records
        if r.status == "completed" and r.last_token is not None and after <= r.last_token < until
    )
    rate = done / (until - after)
    ok = rate >= min_fraction * target
    return CheckResult(
        name,
        ok,
        f"{rate:.2f} req/s completed ({done} requests) vs planner {target:.2f} req/s "
        f"({rate / target - 1:+.1%}; at least {min_fraction:.0%})",
    )


EVIDENCE: dict[str, str | tuple[str, ...]] = {
    "ThroughputCheck.check": (
        "tests/checkers/test_checker_fields.py::test_throughput_after_until_and_min_fraction"
    ),
    "ThroughputCheck.after": (
        "tests/checkers/test_checker_fields.py::test_throughput_after_until_and_min_fraction"
    ),
    "ThroughputCheck.until": (
        "tests/checkers/test_checker_fields.py::test_throughput_after_until_and_min_fraction"
    ),
    "ThroughputCheck.min_fraction": (
        "tests/checkers/test_checker_fields.py::test_throughput_after_until_and_min_fraction"
    ),
}
"""Evidence that each field of this module's models changes what the testbed does: the tests
(`path::function`) that show it, read by tests/test_no_silent_fields.py (a field without a
row here or there fails it)."""
