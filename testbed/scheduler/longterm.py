"""The long-term loop: move local PD instances between the prefill and decode roles.

The short-term loop only moves the threshold t; when the workload or the link changes for good
(prompts get longer, the link stays narrow), the best split of the local cluster into PD-P and
PD-D changes too, and no t makes up for the wrong split. The paper's remedy is to "re-balance
N_p and N_d" on a longer timescale. What it leaves open is when, and we answer it here:

- every check, the planner is re-run with the *observed* input lengths of recent requests and
  the short-term loop's bandwidth estimate, with the PD split left free; its optimum N_p is the
  target;
- the target must promise at least `min_gain` more lambda_max than the running split under the
  same inputs (a split change costs a drain and a role switch, so small predicted gains are
  noise in the length sample, not a reason to move);
- the move must be wanted in the same direction for `sustain` consecutive checks (a burst of
  long prompts is not a shift in traffic); the latest target is the one adopted;
- the stage that grows must be under pressure now (its instances hold on average at least
  `pressure` of their capacity in outstanding work): the model says the split is wrong, the
  queues say it hurts. Without pressure the system keeps up and a conversion only costs.

Draining is started ahead of the decision (`predrain` checks before the streak completes, with
the same gain and pressure): a decode instance holds requests whose prefill is still queued
elsewhere, and under load they took about a minute to leave it after the decision. Drained
ahead, the instance is (nearly) empty when the conversion is decided, so the wait for them
overlaps the confirmation window instead of following it; if the streak breaks, the instance
goes back into rotation (`RoleDecision.prepare` is 0 again).

The controller is pure (no I/O, no clock): the router feeds it and performs the conversions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from testbed.frozen import quick_init
from testbed.planner import StagePlan

__all__ = ["LongTermController", "RoleDecision", "StagePressure"]


@quick_init
@dataclass(frozen=True)
class StagePressure:
    """Outstanding work per instance as a fraction of what one instance holds at capacity.

    prefill: mean outstanding requests per prefill instance, PrfaaS and PD-P together (1.0 =
    each one always busy): a converted PD-P instance relieves either, since t is re-planned;
    decode: mean outstanding requests per PD-D instance over BS_max (1.0 = full batches).
    """

    prefill: float
    decode: float


@dataclass(frozen=True)
class RoleDecision:
    target_prefill: int
    current_prefill: int
    gain: float
    """Predicted lambda_max of the target over the running split, minus 1."""
    act: bool
    reason: str
    plan: StagePlan | None = None
    prepare: int = 0
    """Instances of the shrinking role to drain now, ahead of a conversion this streak is
    heading for (0: none; the loop puts back any it drained ahead)."""


@dataclass
class LongTermController:
    plan: Callable[[int | None], StagePlan]
    """Planner on the current observed inputs; n_prefill None searches the split."""
    n_local: int
    min_gain: float = 0.1
    sustain: int = 6
    pressure: float = 0.8
    min_prefill: int = 1
    min_decode: int = 1
    predrain: int = 0
    """Checks before the streak completes at which draining starts (0: only once it acts)."""
    _streak: int = field(default=0, init=False)
    _last_target: int | None = field(default=None, init=False)

    def update(self, current_prefill: int, pressure: StagePressure) -> RoleDecision:
        best = self.plan(None)
        target = min(max(best.n_prefill, self.min_prefill), self.n_local - self.min_decode)
        if target == current_prefill:
            self._streak, self._last_target = 0, None
            return RoleDecision(target, current_prefill, 0.0, False, "split is optimal", best)
        running = self.plan(current_prefill)
        chosen = best if target == best.n_prefill else self.plan(target)
        gain = (
            chosen.lambda_max_rps / running.lambda_max_rps - 1
            if running.lambda_max_rps > 0
            else float("inf")
        )
        if gain < self.min_gain:
            self._streak, self._last_target = 0, None
            return RoleDecision(
                target, current_prefill, gain, False, f"gain {gain:.0%} < {self.min_gain:.0%}",
                chosen,
            )  # fmt: skip
        # The streak counts checks that want to move the same way; the target itself may still
        # be moving while the observed lengths turn over (1 -> 3 -> 5 PD-P after a shift).
        same_way = self._last_target is not None and (
            (self._last_target > current_prefill) == (target > current_prefill)
        )
        self._streak = self._streak + 1 if same_way else 1
        self._last_target = target
        grows = "prefill" if target > current_prefill else "decode"
        level = pressure.prefill if grows == "prefill" else pressure.decode
        hot = level >= self.pressure
        if self._streak < self.sustain:
            ahead = self.predrain > 0 and self._streak >= max(1, self.sustain - self.predrain)
            return RoleDecision(
                target, current_prefill, gain, False,
                f"target held {self._streak}/{self.sustain} checks"
                + (", draining ahead" if ahead and hot else ""), chosen,
                prepare=abs(target - current_prefill) if ahead and hot else 0,
            )  # fmt: skip
        if not hot:
            return RoleDecision(
                target, current_prefill, gain, False,
                f"{grows} not under pressure ({level:.2f} < {self.pressure:.2f})", chosen,
            )  # fmt: skip
        self._streak, self._last_target = 0, None
        return RoleDecision(
            target, current_prefill, gain, True,
            f"{grows}-bound: {current_prefill}/{self.n_local - current_prefill} -> "
            f"{target}/{self.n_local - target}, +{gain:.0%} lambda_max", chosen,
        )  # fmt: skip
