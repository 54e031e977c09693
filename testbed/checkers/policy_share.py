"""policy_share: the policy under test decided (almost) every routing decision itself.

An outside policy (a plugin or an HTTP service) that fails a decision is replaced by its
fallback for that request (testbed.policy.decider): the run goes on, nothing is lost, and every
figure of the run is then partly the fallback's. A verdict on the policy is only worth what the
policy decided, so this check fails the run when the share of decisions the policy made is under
`min` (default 0.99), naming the share, the counts and the fallbacks by kind (the reason up to
its first ':'). `testbed run` adds it by default for outside policies (testbed.scenario.plan);
a built-in policy has no fallback, so the check would only say 100%.

Counted: records with `decided_by` set (a request never routed has none), as `policy` or
`fallback`. Left out: decisions asked while a `scheduler-*` fault was in force, from its start
to its end plus the time the end action took (a restart waits for the service to answer again)
plus `settle` (default 10 s, real-world): those faults exist to make the fallback decide (the
`fallback` checker judges them), and their aftermath is theirs too: answers a slowed proxy still
holds drain after the fault's end, and a resumed service first works off the requests that
queued while it was stopped (measured on burst at time_scale 10: late answers for 7 s of
real-world time after a 200 ms `scheduler-slow` ended). A record's
arrival stands for the time its decision was asked: it is asked on arrival, and a re-route after
a failed attempt comes within seconds of it. Vacuous when no decision is left to judge.

The scorecard (testbed.metrics.scorecard) reads each run's share with `policy_share` too.

```yaml
checkers:
  - {check: policy_share, min: 0.95, settle: 5s}
```
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field

from testbed.checkers.base import CheckerConfig, CheckInput, checker
from testbed.checkers.history import fault_windows
from testbed.checkers.result import CheckResult, vacuous
from testbed.config import Duration
from testbed.metrics.records import HistoryEvent, RequestRecord
from testbed.nemesis import ACTIONS
from testbed.policy.decider import fallback_kind

__all__ = [
    "DEFAULT_MIN_SHARE",
    "PolicyShareCheck",
    "Share",
    "policy_share",
    "reasons_text",
    "scheduler_fault_windows",
]

DEFAULT_MIN_SHARE = 0.99
"""The share of decisions the policy under test must make itself, by default (the checker's
`min`, the scorecard's `--min-policy-share`)."""
DEFAULT_SETTLE_S = 10.0
"""Real-world seconds after a scheduler fault's end that are still the fault's (`settle`)."""


class PolicyShareCheck(CheckerConfig):
    check: Literal["policy_share"] = "policy_share"
    min: float = Field(
        DEFAULT_MIN_SHARE,
        ge=0,
        le=1,
        description="the least share of decisions the policy must make itself (not its fallback)",
    )
    settle: Duration = Field(
        DEFAULT_SETTLE_S,
        description="after a scheduler-* fault ends, how long its aftermath is left out too",
    )


@dataclass(frozen=True)
class Share:
    """Who decided a run's routes, scheduler fault windows left out."""

    policy: int = 0
    fallback: int = 0
    reasons: Mapping[str, int] = field(default_factory=dict)
    """Fallbacks by kind (the reason up to its first ':')."""
    left_out: int = 0
    """Decisions asked during a scheduler-* fault (not counted above)."""

    @property
    def decided(self) -> int:
        return self.policy + self.fallback

    @property
    def share(self) -> float | None:
        """The policy's share of the decisions; None when none is left to judge."""
        return self.policy / self.decided if self.decided else None

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "fallback": self.fallback,
            "reasons": dict(self.reasons),
            "left_out": self.left_out,
            "share": self.share,
        }

    @classmethod
    def total(cls, shares: Sequence[Mapping[str, Any]]) -> Share:
        """The sum of several runs' shares (`to_json` dicts), as one run's over all seeds."""
        reasons: Counter[str] = Counter()
        for s in shares:
            reasons.update(s.get("reasons") or {})
        return cls(
            sum(int(s.get("policy", 0)) for s in shares),
            sum(int(s.get("fallback", 0)) for s in shares),
            dict(sorted(reasons.items())),
            sum(int(s.get("left_out", 0)) for s in shares),
        )


def scheduler_fault_windows(
    history: Sequence[HistoryEvent], settle_s: float = DEFAULT_SETTLE_S
) -> list[tuple[float, float]]:
    """(start, end) of every applied `scheduler-*` fault, the end pushed back by the time its
    end action took (`took_s`: a restarted service is back only once it answers) and by
    `settle_s` (its aftermath)."""
    took = {
        (e.data.get("action"), e.t): float(e.data.get("took_s") or 0.0)
        for e in history
        if e.kind == "fault" and e.data.get("phase") == "end"
    }
    out = []
    for action in ACTIONS:
        if action.startswith("scheduler-"):
            for start, end, _ in fault_windows(history, action):
                if not math.isinf(end):
                    end += took.get((action, end), 0.0) + settle_s
                out.append((start, end))
    return out


def policy_share(
    records: Sequence[RequestRecord],
    history: Sequence[HistoryEvent],
    settle_s: float = DEFAULT_SETTLE_S,
) -> Share:
    """Who decided the routes of `records`, decisions during scheduler faults (and `settle_s`
    after each) left out."""
    windows = scheduler_fault_windows(history, settle_s)
    by: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    left_out = 0
    for r in records:
        if r.decided_by is None:
            continue
        if any(lo <= r.arrival < hi for lo, hi in windows):
            left_out += 1
            continue
        by[r.decided_by] += 1
        if r.decided_by == "fallback":
            reasons[fallback_kind(r.fallback_reason or "error")] += 1
    return Share(by["policy"], by["fallback"], dict(sorted(reasons.items())), left_out)


def reasons_text(reasons: Mapping[str, int]) -> str:
    """The fallbacks by kind, the most frequent first: "status 548, timeout 3"."""
    ranked = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{k} {v}" for k, v in ranked) or "none"


@checker(PolicyShareCheck)
def check_policy_share(cfg: PolicyShareCheck, run: CheckInput) -> CheckResult:
    s = policy_share(run.records, run.history, cfg.settle)
    name = "policy_share"
    out = f"; {s.left_out} asked during scheduler faults left out" if s.left_out else ""
    if s.share is None:
        return vacuous(name, f"no routing decision to judge{out}")
    detail = (
        f"the policy decided {s.policy} of {s.decided} ({s.share:.1%}, at least {cfg.min:.1%}); "
        f"by the fallback {s.fallback} ({reasons_text(s.reasons)}){out}"
    )
    return CheckResult(name, s.share >= cfg.min, detail)


EVIDENCE: dict[str, str | tuple[str, ...]] = {
    "PolicyShareCheck.check": (
        "tests/checkers/test_policy_share.py::"
        "test_the_check_is_on_by_default_for_outside_policies_only"
    ),
    "PolicyShareCheck.min": (
        "tests/checkers/test_policy_share.py::"
        "test_the_share_fails_under_min_and_names_the_fallbacks_by_kind"
    ),
    "PolicyShareCheck.settle": (
        "tests/checkers/test_policy_share.py::"
        "test_a_faults_aftermath_is_left_out_for_settle_after_its_end"
    ),
}
"""Evidence that each field of this module's models changes what the testbed does: the tests
(`path::function`) that show it, read by tests/test_no_silent_fields.py (a field without a
row here or there fails it)."""
