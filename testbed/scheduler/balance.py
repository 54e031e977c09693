"""Queue balance: a multiplicative correction of the planner's t from the two prefill routes'
expected waits.

The planner's t maximises lambda_max: it balances the stages' *capacities*. It says nothing
about backlog already standing in front of one route: after a bandwidth drop the link holds
seconds of KV, after a role conversion the PrfaaS queue holds the requests that arrived while
the split was wrong. Until that backlog drains, a request sent to the backlogged route waits for
it, although the other route has room. So each short-term tick compares the expected wait of a
new request on each route (PrfaaS: prefill queue plus the link's queue; PD-P: prefill queue)
and moves t by one `step` towards the emptier route when they differ by more than `margin`
(hysteresis); when both are short it decays back to the planner's t. The bias is bounded, so
the planner keeps the last word on where t sits.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["QueueBalance"]


@dataclass
class QueueBalance:
    margin_s: float = 2.0
    step: float = 1.1
    max_bias: float = 4.0
    bias: float = 1.0

    def update(self, wait_prfaas_s: float, wait_local_s: float) -> float:
        """Feed the two routes' expected waits (real seconds); returns the new bias (t x bias)."""
        diff = wait_prfaas_s - wait_local_s
        if diff > self.margin_s:  # PrfaaS side backlogged: keep more prompts local
            self.bias = min(self.bias * self.step, self.max_bias)
        elif diff < -self.margin_s:  # PD-P backlogged: offload more
            self.bias = max(self.bias / self.step, 1 / self.max_bias)
        elif max(wait_prfaas_s, wait_local_s) < self.margin_s:  # both short: back to the plan
            if self.bias > 1:
                self.bias = max(self.bias / self.step, 1.0)
            elif self.bias < 1:
                self.bias = min(self.bias * self.step, 1.0)
        return self.bias
