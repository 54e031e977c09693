"""The short-term loop: re-search the threshold t when the measured bandwidth moves.

Re-planning is the paper's own remedy ("re-profile capacity and bandwidth and re-search t");
what it leaves open is when. We re-plan when the bandwidth estimate differs by more than
`replan_change` from the one the current t was planned with, and adopt the new t only if it
differs by more than `min_t_change` and the last change is at least `cooldown_s` old, so
measurement noise does not make routing flap (hysteresis). Bandwidth counts as scarce when the
planned PrfaaS egress would use more than `scarce_utilisation` of the estimate; the cache-aware
rule reads that flag.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from testbed.frozen import quick_init
from testbed.planner import StagePlan

__all__ = ["ThresholdController", "ThresholdDecision"]


@quick_init
@dataclass(frozen=True)
class ThresholdDecision:
    threshold_tokens: float
    bandwidth: float
    """Real bytes/s the threshold was planned with."""
    scarce: bool
    changed: bool


@dataclass
class ThresholdController:
    plan: Callable[[float], StagePlan]
    """Planner for the deployment at a given link bandwidth (real bytes/s)."""
    nominal: float
    replan_change: float = 0.2
    min_t_change: float = 0.05
    cooldown_s: float = 2.0
    scarce_utilisation: float = 0.7

    def __post_init__(self) -> None:
        first = self.plan(self.nominal)
        assert first.threshold_tokens is not None
        self.threshold = first.threshold_tokens
        self.planned_bandwidth = self.nominal
        self.scarce = self._scarce(first, self.nominal)
        self._changed_at = float("-inf")
        self._kept: ThresholdDecision | None = None
        """The unchanged decision, until the next plan: most ticks plan nothing and get it."""

    def _scarce(self, plan: StagePlan, bandwidth: float) -> bool:
        return plan.egress_gbps * 1e9 / 8 > self.scarce_utilisation * bandwidth

    def moved(self, bandwidth: float) -> bool:
        """The estimate left the band around the one t was planned with: `update` re-plans."""
        return abs(bandwidth - self.planned_bandwidth) > self.replan_change * self.planned_bandwidth

    def update(self, now: float, bandwidth: float) -> ThresholdDecision:
        """`now` in real seconds, `bandwidth` the current estimate in real bytes/s."""
        return self._replan(now, bandwidth) if self.moved(bandwidth) else self.kept()

    def replan(self, now: float, bandwidth: float) -> ThresholdDecision:
        """Re-plan even if the bandwidth did not move: the planner's other inputs did (the
        observed prompt lengths, or the PD split after a role conversion)."""
        return self._replan(now, bandwidth)

    def kept(self) -> ThresholdDecision:
        """The decision in force, unchanged: `update`'s answer while the estimate has not
        `moved`; the same object until the next plan."""
        kept = self._kept
        if kept is None:
            kept = self._kept = ThresholdDecision(
                self.threshold, self.planned_bandwidth, self.scarce, False
            )
        return kept

    def _replan(self, now: float, bandwidth: float) -> ThresholdDecision:
        if now - self._changed_at >= self.cooldown_s:
            plan = self.plan(bandwidth)
            t = plan.threshold_tokens
            assert t is not None
            self.scarce = self._scarce(plan, bandwidth)
            self.planned_bandwidth = bandwidth
            self._kept = None
            if abs(t - self.threshold) > self.min_t_change * self.threshold:
                self.threshold = t
                self._changed_at = now
                return ThresholdDecision(t, bandwidth, self.scarce, True)
        return self.kept()
