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
