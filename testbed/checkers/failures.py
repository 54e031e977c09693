"""failures: at most a fraction of submitted requests failed (each with a reason)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from testbed.checkers.base import CheckerConfig, CheckInput, checker
from testbed.checkers.result import CheckResult, vacuous
from testbed.metrics.records import RequestRecord

__all__ = ["FailuresCheck", "check_failures"]


class FailuresCheck(CheckerConfig):
    check: Literal["failures"] = "failures"
    max_fraction: float = Field(ge=0, le=1)


@checker(FailuresCheck)
def failures(cfg: FailuresCheck, run: CheckInput) -> CheckResult:
    return check_failures(run.records, run.submitted, cfg.max_fraction)


def check_failures(
    records: Sequence[RequestRecord], submitted: int, max_fraction: float
) -> CheckResult:
    failed = sum(1 for r in records if r.status == "failed")
    if not submitted:
        return vacuous("failures", "no request was submitted")
    frac = failed / submitted
    detail = f"{failed} of {submitted} failed ({frac:.1%}, at most {max_fraction:.1%})"
    return CheckResult("failures", frac <= max_fraction, detail)


EVIDENCE: dict[str, str | tuple[str, ...]] = {
    "FailuresCheck.check": ("tests/checkers/test_checker_fields.py::test_failures_max_fraction"),
    "FailuresCheck.max_fraction": (
        "tests/checkers/test_checker_fields.py::test_failures_max_fraction"
    ),
}
"""Evidence that each field of this module's models changes what the testbed does: the tests
(`path::function`) that show it, read by tests/test_no_silent_fields.py (a field without a
row here or there fails it)."""
