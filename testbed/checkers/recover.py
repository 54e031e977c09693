"""recover: after a fault ends, TTFT is back under a bound soon.

After each `fault` ends, the first request (by arrival, arriving after the end) that starts a
run of `streak` consecutive completed requests with TTFT under `ttft` arrives no later than
`within` after the end. Vacuous if the fault never ended in the run or fewer than `streak`
requests arrived after it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from testbed.checkers.base import ActionName, CheckerConfig, CheckInput, checker, fault_problems
from testbed.checkers.history import fault_windows, not_applied
from testbed.checkers.result import CheckResult, Verdict, combine, seconds, vacuous
from testbed.config import PositiveDuration
from testbed.metrics.records import HistoryEvent, RequestRecord
from testbed.nemesis import NemesisEvent

__all__ = ["RecoverCheck", "check_recover"]


class RecoverCheck(CheckerConfig):
    check: Literal["recover"] = "recover"
    fault: ActionName
    within: PositiveDuration
    ttft: PositiveDuration
    streak: int = Field(3, ge=1, le=1000)

    def problems(self, nemesis: Sequence[NemesisEvent], duration_s: float) -> list[str]:
        return fault_problems(self.fault, nemesis, must_end=True)


@checker(RecoverCheck)
def recover(cfg: RecoverCheck, run: CheckInput) -> CheckResult:
    return check_recover(run.records, run.history, cfg.fault, cfg.within, cfg.ttft, cfg.streak)


def check_recover(
    records: Sequence[RequestRecord],
    history: Sequence[HistoryEvent],
    fault: str,
    within_s: float,
    ttft_s: float,
    streak: int = 3,
) -> CheckResult:
    """After each `fault` ends, TTFT is back under `ttft_s` within `within_s` (see module).

    A fault that never ended, or after whose end fewer than `streak` requests arrived and no
    good streak was seen, leaves nothing to judge: vacuous, not ok."""
    name = f"recover_{fault}"
    windows = fault_windows(history, fault)
    if not windows:
        return vacuous(name, not_applied(history, fault))
    parts: list[tuple[Verdict, str]] = []
    ordered = sorted(records, key=lambda r: (r.arrival, r.id))
    for _start, end, target in windows:
        what = f"{fault}{' of ' + target if target else ''}"
        if math.isinf(end):
            parts.append(
                ("vacuous", f"{what}: never ended in this run, so nothing to recover from")
            )
            continue
        after = [r for r in ordered if r.arrival >= end]
        good_at: float | None = None
        for i in range(len(after) - streak + 1):
            window = after[i : i + streak]
            if all(r.status == "completed" and (r.ttft or math.inf) <= ttft_s for r in window):
                good_at = after[i].arrival
                break
        if good_at is None and len(after) < streak:
            parts.append(
                (
                    "vacuous",
                    f"{what} ended at {end:.4g}s: {len(after)} requests arrived after it, fewer "
                    f"than the streak of {streak} that recovery needs",
                )
            )
            continue
        if good_at is None:
            parts.append(
                (
                    "failed",
                    f"{what} ended at {end:.4g}s: TTFT never back under {seconds(ttft_s)} for "
                    f"{streak} requests in a row ({len(after)} arrived after it)",
                )
            )
            continue
        took = good_at - end
        parts.append(
            (
                "ok" if took <= within_s else "failed",
                f"{what} ended at {end:.4g}s: TTFT under {seconds(ttft_s)} again after "
                f"{seconds(took)} (bound {seconds(within_s)})",
            )
        )
    return combine(name, parts)


EVIDENCE: dict[str, str | tuple[str, ...]] = {
    "RecoverCheck.check": (
        "tests/checkers/test_checker_fields.py::test_recover_fault_within_ttft_and_streak"
    ),
    "RecoverCheck.fault": (
        "tests/checkers/test_checker_fields.py::test_recover_fault_within_ttft_and_streak"
    ),
    "RecoverCheck.within": (
        "tests/checkers/test_checker_fields.py::test_recover_fault_within_ttft_and_streak"
    ),
    "RecoverCheck.ttft": (
        "tests/checkers/test_checker_fields.py::test_recover_fault_within_ttft_and_streak"
    ),
    "RecoverCheck.streak": (
        "tests/checkers/test_checker_fields.py::test_recover_fault_within_ttft_and_streak"
    ),
}
"""Evidence that each field of this module's models changes what the testbed does: the tests
(`path::function`) that show it, read by tests/test_no_silent_fields.py (a field without a
row here or there fails it)."""
