"""A checker's verdict on a run, and the small helpers every checker words its detail with."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["CheckResult", "Verdict", "combine", "seconds", "show_ids", "vacuous"]

SHOW = 5
"""How many offending ids a detail line names."""

Verdict = Literal["ok", "failed", "vacuous"]


@dataclass
class CheckResult:
    """One checker's verdict on a run.

    `ok` means "passed": a check that had nothing to judge (no request in scope, a fault that
    never applied or never ended, zero completed requests for a percentile) is `vacuous`, with
    `ok` false: it did not fail, and it did not pass either, so a script that counts `ok` never
    counts a check that exercised nothing as a pass. It is reported as such (summary.json,
    report.md, the printed check lines) and does not fail the run: what gates a run (its exit
    code, `RunResult.ok`) is `verdict != "failed"` (`failed`). A suite that means to test
    something asserts a vacuous verdict never happens.
    """

    name: str
    ok: bool
    detail: str
    vacuous: bool = False

    def __post_init__(self) -> None:
        if self.vacuous and self.ok:
            raise ValueError(f"check {self.name}: a vacuous check did not pass; ok must be False")

    @property
    def verdict(self) -> Verdict:
        if self.vacuous:
            return "vacuous"
        return "ok" if self.ok else "failed"

    @property
    def failed(self) -> bool:
        """What gates a run: this check failed (a vacuous one did not)."""
        return self.verdict == "failed"

    def to_json(self) -> dict[str, Any]:
        """The entry of summary.json `checks`."""
        return {"name": self.name, "ok": self.ok, "verdict": self.verdict, "detail": self.detail}


def vacuous(name: str, detail: str) -> CheckResult:
    """A check that exercised nothing: not ok, not failed."""
    return CheckResult(name, False, detail, vacuous=True)


def combine(name: str, parts: Sequence[tuple[Verdict, str]]) -> CheckResult:
    """One result from per-fault verdicts: failed if any failed, else vacuous if any part
    exercised nothing (the claim "after each fault" was not shown for that one), else ok."""
    detail = "; ".join(text for _, text in parts)
    verdicts = {v for v, _ in parts}
    if "failed" in verdicts:
        return CheckResult(name, False, detail)
    if "vacuous" in verdicts or not parts:
        return vacuous(name, detail)
    return CheckResult(name, True, detail)


def show_ids(ids: Sequence[str]) -> str:
    """The first few ids of a list, and how many more."""
    more = f" (+{len(ids) - SHOW} more)" if len(ids) > SHOW else ""
    return ", ".join(ids[:SHOW]) + more


def seconds(v: float) -> str:
    return f"{v:.3g}s"
