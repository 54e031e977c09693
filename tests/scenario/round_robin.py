"""A round-robin routing plugin, as a new user writes one from docs/policy-protocol.md (issue
#30): every prefill instance of both clusters in turn, every decode instance in turn, blind to
lengths, load and the link. `--policy tests.scenario.round_robin:RoundRobin`.

It is uniformly slow, which is what makes it a test: on bandwidth-drop it is worse than both
baselines on every figure, yet passes the scenario's ratio checker (P90 TTFT during the drop
against the minute before it) that they fail; the scorecard must not call that a win."""

from __future__ import annotations

from typing import ClassVar

from testbed.policy.base import RequestView, Route, Snapshot


class RoundRobin:
    name: ClassVar[str] = "round-robin"
    deployment_kind: ClassVar[str] = "prfaas-pd"
    needs_threshold: ClassVar[bool] = True
    """It ignores the threshold; its fallback (prfaas-static) routes by it."""
    replans: ClassVar[bool] = False
    long_term: ClassVar[bool] = False
    cache_aware: ClassVar[bool] = False

    def __init__(self) -> None:
        self.turn = 0

    def decide(self, request: RequestView, snapshot: Snapshot) -> Route:
        ok = sorted((i for i in snapshot.instances if i.state == "ok"), key=lambda i: i.id)
        prefill = [i for i in ok if i.role == "prefill"]
        decode = [i for i in ok if i.role == "decode"]
        if not prefill or not decode:
            raise LookupError("no usable prefill or decode instance")
        p, d = prefill[self.turn % len(prefill)], decode[self.turn % len(decode)]
        self.turn += 1
        cached = request.cached_prfaas if p.cluster == "prfaas" else request.cached_local
        return Route(p.cluster, p.id, d.id, request.input_tokens - cached)
