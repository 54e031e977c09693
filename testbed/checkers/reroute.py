"""reroute: after a fault starts, a request that avoids the faulty target starts prefill soon.

After each `fault` (a "fault" history event) starts, the first request whose path avoids the
faulty target starts prefill within `within`. For link faults the target is the link: a request
avoids it by not crossing datacenters, and only requests the policy would offload (uncached
length above the lowest threshold any request saw; all requests if none had one) count. For
process faults a request avoids the target if neither its prefill nor its decode instance is one
of the faulty instances. Vacuous if no request needed re-routing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from testbed.checkers.base import ActionName, CheckerConfig, CheckInput, checker, fault_problems
from testbed.checkers.history import fault_windows, not_applied
from testbed.checkers.result import CheckResult, Verdict, combine, seconds, vacuous
from testbed.config import PositiveDuration
from testbed.metrics.records import HistoryEvent, RequestRecord
from testbed.nemesis import NemesisEvent

__all__ = ["RerouteCheck", "check_reroute"]


class RerouteCheck(CheckerConfig):
    check: Literal["reroute"] = "reroute"
    fault: ActionName
    within: PositiveDuration

    def problems(self, nemesis: Sequence[NemesisEvent], duration_s: float) -> list[str]:
        return fault_problems(self.fault, nemesis)


@checker(RerouteCheck)
def reroute(cfg: RerouteCheck, run: CheckInput) -> CheckResult:
    return check_reroute(run.records, run.history, cfg.fault, cfg.within)


def _in_scope(r: RequestRecord, instances: set[str], t_min: float | None) -> bool:
    """Whether a request would have used the faulty target (see the module docstring)."""
    if instances:
        return True
    return t_min is None or r.input_tokens - r.cached_tokens > t_min


def _avoids(r: RequestRecord, instances: set[str]) -> bool:
    if instances:
        return r.prefill_instance not in instances and r.decode_instance not in instances
    return not r.cross_dc


def check_reroute(
    records: Sequence[RequestRecord],
    history: Sequence[HistoryEvent],
    fault: str,
    within_s: float,
) -> CheckResult:
    """After each `fault` starts, a request avoiding its target starts prefill within bound.

    A fault during which no request in scope arrived exercised nothing: vacuous, not ok."""
    name = f"reroute_{fault}"
    windows = fault_windows(history, fault)
    if not windows:
        return vacuous(name, not_applied(history, fault))
    thresholds = [r.threshold_tokens for r in records if r.threshold_tokens is not None]
    t_min = min(thresholds) if thresholds else None
    parts: list[tuple[Verdict, str]] = []
    for start, end, target in windows:
        instances = set(target.split(",")) if target and target != "link" else set()

        scoped = [r for r in records if _in_scope(r, instances, t_min) and start <= r.arrival < end]
        served = [
            r.prefill_start
            for r in records
            if r.status == "completed"
            and _in_scope(r, instances, t_min)
            and _avoids(r, instances)
            and r.prefill_start is not None
            and start <= r.prefill_start < end
        ]
        what = f"{fault}{' of ' + target if target else ''} at {start:.4g}s"
        if served:
            took = min(served) - start
            verdict: Verdict = "ok" if took <= within_s else "failed"
            parts.append(
                (verdict, f"{what}: re-routed after {seconds(took)} (bound {seconds(within_s)})")
            )
        elif not scoped:
            parts.append(("vacuous", f"{what}: no request needing re-routing arrived during it"))
        else:
            parts.append(
                ("failed", f"{what}: none of {len(scoped)} requests arriving during it avoided it")
            )
    return combine(name, parts)


EVIDENCE: dict[str, str | tuple[str, ...]] = {
    "RerouteCheck.check": ("tests/checkers/test_checker_fields.py::test_reroute_fault_and_within"),
    "RerouteCheck.fault": ("tests/checkers/test_checker_fields.py::test_reroute_fault_and_within"),
    "RerouteCheck.within": ("tests/checkers/test_checker_fields.py::test_reroute_fault_and_within"),
}
"""Evidence that each field of this module's models changes what the testbed does: the tests
(`path::function`) that show it, read by tests/test_no_silent_fields.py (a field without a
row here or there fails it)."""
