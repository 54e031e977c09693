"""fallback: while an outside scheduler is down, slow or paused, the fallback policy took over
in time and nothing was lost.

For each window of `fault` (scheduler-kill, scheduler-pause, scheduler-slow): every request
that arrived during it ended `completed` (none lost to the scheduler's trouble), at least one of
them was routed by the fallback (`decided_by: fallback`; else the fault exercised nothing:
vacuous), and no routing decision during it took longer than `max_decision`, wall-clock like
the policy's timeout (a decision that falls back waits out the timeout at most, then the
fallback answers at once; give the timeout plus some slack). Decision latencies come from the
request records (`decision_wall_s`, testbed.policy.decider).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from testbed.checkers.base import ActionName, CheckerConfig, CheckInput, checker, fault_problems
from testbed.checkers.history import fault_windows, not_applied
from testbed.checkers.result import CheckResult, Verdict, combine, show_ids, vacuous
from testbed.config import PositiveDuration
from testbed.nemesis import NemesisEvent

__all__ = ["FallbackCheck"]


class FallbackCheck(CheckerConfig):
    check: Literal["fallback"] = "fallback"
    fault: ActionName
    max_decision: PositiveDuration = Field(
        description="wall-clock bound on one routing decision during the fault"
    )

    def problems(self, nemesis: Sequence[NemesisEvent], duration_s: float) -> list[str]:
        return fault_problems(self.fault, nemesis)


@checker(FallbackCheck)
def fallback(cfg: FallbackCheck, run: CheckInput) -> CheckResult:
    name = f"fallback_{cfg.fault}"
    windows = fault_windows(run.history, cfg.fault)
    if not windows:
        return vacuous(name, not_applied(run.history, cfg.fault))
    bound_ms = cfg.max_decision * 1e3
    parts: list[tuple[Verdict, str]] = []
    for start, end, _ in windows:
        during = [r for r in run.records if start <= r.arrival < end]
        what = f"{cfg.fault} at {start:.4g}s"
        lost = [r.id for r in during if r.status != "completed"]
        took = [r for r in during if r.decided_by == "fallback"]
        slow = [
            r.id for r in during
            if r.decision_wall_s is not None and r.decision_wall_s > cfg.max_decision
        ]  # fmt: skip
        worst = max((r.decision_wall_s or 0.0 for r in during), default=0.0) * 1e3
        if lost or slow:
            why = []
            if lost:
                why.append(f"{len(lost)} of {len(during)} arriving during it not completed "
                           f"({show_ids(lost)})")  # fmt: skip
            if slow:
                why.append(f"{len(slow)} decisions over {bound_ms:g} ms ({show_ids(slow)})")
            parts.append(("failed", f"{what}: " + "; ".join(why)))
        elif not took:
            parts.append(("vacuous", f"{what}: {len(during)} requests arrived during it, none "
                          "routed by the fallback: it exercised nothing"))  # fmt: skip
        else:
            parts.append(("ok", f"{what}: {len(during)} arrived, all completed; {len(took)} "
                          f"routed by the fallback; slowest decision {worst:.3g} ms "
                          f"(bound {bound_ms:g} ms)"))  # fmt: skip
    return combine(name, parts)


EVIDENCE: dict[str, str | tuple[str, ...]] = {
    "FallbackCheck.check": (
        "tests/policy/test_policy_faults.py::test_fallback_check_passes_lost_slow_and_vacuous"
    ),
    "FallbackCheck.fault": (
        "tests/policy/test_policy_faults.py::test_fallback_check_passes_lost_slow_and_vacuous"
    ),
    "FallbackCheck.max_decision": (
        "tests/policy/test_policy_faults.py::test_fallback_check_passes_lost_slow_and_vacuous"
    ),
}
"""Evidence that each field of this module's models changes what the testbed does: the tests
(`path::function`) that show it, read by tests/test_no_silent_fields.py (a field without a
row here or there fails it)."""
