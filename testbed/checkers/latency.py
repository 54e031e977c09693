"""ttft / tpot / e2e: a percentile of completed requests stays under a bound.

Percentile `p` of completed requests is at most `max` (only requests arriving while a `during`
fault is in force, if given), or at most `max_ratio` x the same percentile over the requests
that arrived in an equally long window just before the first such fault.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from testbed.checkers.base import ActionName, CheckerConfig, CheckInput, checker, fault_problems
from testbed.checkers.history import fault_windows, not_applied
from testbed.checkers.result import CheckResult, seconds, vacuous
from testbed.config import PositiveDuration
from testbed.metrics.records import HistoryEvent, RequestRecord
from testbed.metrics.summary import stats
from testbed.nemesis import NemesisEvent

__all__ = ["LatencyCheck", "check_latency"]


class LatencyCheck(CheckerConfig):
    check: Literal["ttft", "tpot", "e2e"]
    p: float = Field(90.0, gt=0, le=100)
    max: PositiveDuration | None = None
    during: ActionName | None = None
    max_ratio: float | None = Field(None, gt=0)
    """With `during`: the bound is max_ratio x the same percentile over the requests that
    arrived in an equally long window just before the first such fault."""

    @model_validator(mode="after")
    def _one_bound(self) -> LatencyCheck:
        if (self.max is None) == (self.max_ratio is None):
            raise ValueError(f"check {self.check!r} needs exactly one of 'max', 'max_ratio'")
        if self.max_ratio is not None and self.during is None:
            raise ValueError("'max_ratio' compares with the time before a fault: set 'during'")
        return self

    def problems(self, nemesis: Sequence[NemesisEvent], duration_s: float) -> list[str]:
        return fault_problems(self.during, nemesis)


@checker(LatencyCheck)
def latency(cfg: LatencyCheck, run: CheckInput) -> CheckResult:
    bound = cfg.max if cfg.max is not None else math.inf
    return check_latency(
        run.records, cfg.check, cfg.p, bound,
        history=run.history, during=cfg.during, max_ratio=cfg.max_ratio,
    )  # fmt: skip


def check_latency(
    records: Sequence[RequestRecord],
    metric: str,
    p: float,
    bound_s: float,
    *,
    history: Sequence[HistoryEvent] = (),
    during: str | None = None,
    max_ratio: float | None = None,
) -> CheckResult:
    """Percentile `p` of `metric` ("ttft", "tpot" or "e2e") over completed requests <= bound;
    with `during`, only over requests that arrived while such a fault was in force. With
    `max_ratio` the bound is max_ratio x the percentile over the requests that arrived in an
    equally long window just before the first such fault (the "pre-fault value")."""
    name = f"{metric}_p{p:g}" + (f"_during_{during}" if during else "")
    baseline = ""
    if during is not None:
        windows = fault_windows(history, during)
        if not windows:
            return vacuous(name, not_applied(history, during))
        if max_ratio is not None:
            start, end, _ = windows[0]
            length = (end if math.isfinite(end) else start + 60.0) - start
            before = [
                v
                for r in records
                if start - length <= r.arrival < start
                and r.status == "completed"
                and (v := getattr(r, metric)) is not None
            ]
            if not before:
                return vacuous(
                    name,
                    f"no completed request in the {seconds(length)} before the {during}: "
                    "no pre-fault value to compare with",
                )
            pre = float(np.percentile(before, p))
            bound_s = max_ratio * pre
            baseline = f" = {max_ratio:g} x p{p:g} {seconds(pre)} before the {during}"
        records = [r for r in records if any(s <= r.arrival < e for s, e, _ in windows)]
    values = [
        v for r in records if r.status == "completed" and (v := getattr(r, metric)) is not None
    ]
    if not values:
        where = f" among requests arriving during the {during}" if during else ""
        failed = sum(1 for r in records if r.status == "failed")
        return vacuous(
            name,
            f"no completed request has a {metric}{where} ({len(records)} requests, "
            f"{failed} failed): no percentile to bound",
        )
    got = float(np.percentile(values, p))
    mean = stats(values)["mean"]
    detail = (
        f"{metric} p{p:g} {seconds(got)} (bound {seconds(bound_s)}{baseline}) over {len(values)} "
        "completed; "
        f"mean {seconds(mean or 0.0)}"
    )
    return CheckResult(name, got <= bound_s, detail)


EVIDENCE: dict[str, str | tuple[str, ...]] = {
    "LatencyCheck.check": (
        "tests/checkers/test_checker_fields.py::test_latency_check_picks_the_metric"
    ),
    "LatencyCheck.p": ("tests/checkers/test_checker_fields.py::test_latency_p_and_max"),
    "LatencyCheck.max": ("tests/checkers/test_checker_fields.py::test_latency_p_and_max"),
    "LatencyCheck.during": (
        "tests/checkers/test_checker_fields.py::test_latency_during_and_max_ratio"
    ),
    "LatencyCheck.max_ratio": (
        "tests/checkers/test_checker_fields.py::test_latency_during_and_max_ratio"
    ),
}
"""Evidence that each field of this module's models changes what the testbed does: the tests
(`path::function`) that show it, read by tests/test_no_silent_fields.py (a field without a
row here or there fails it)."""
