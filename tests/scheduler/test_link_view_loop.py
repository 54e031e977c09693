"""The short-term loop measuring the link alone (`SchedulerSpec.replans` False: a policy that
reads the link without re-planning): the link view follows the senders' counters, nothing
is assumed before it is measured, the threshold and the history stay as the scenario put them."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from testbed.clock import Scale
from testbed.config import DeploymentConfig, LognormalLengths
from testbed.scheduler.cluster import Role, SenderCounters
from testbed.scheduler.loops import ControlLoops
from testbed.scheduler.spec import SchedulerSpec
from testbed.scheduler.state import SchedulerState

GBPS = 1e9 / 8
DEP = DeploymentConfig.model_validate(
    {
        "kind": "prfaas-pd",
        "prfaas": {"hardware": "h200x8", "instances": 1},
        "local": {"hardware": "h20x8", "instances": 2, "prefill": 1, "decode": 1},
        "link": {"bandwidth": "100Gbps", "rtt": "10ms"},
    }
)


class StepClock:
    """Real-world time that moves one `interval` per loop sleep, and only then."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def real(self, wall_s: float) -> float:
        return wall_s

    async def sleep(self, real_s: float) -> None:
        self.t += real_s
        await asyncio.sleep(0)


@dataclass(frozen=True)
class Inst:
    id: str
    cluster: str
    role: str
    switchable: bool = False


class Sender:
    """One PrfaaS sender delivering 5 Gbps with 2 GB standing in front of it; the first
    sample's in-flight counter carries a float residue below zero."""

    def __init__(self, clock: StepClock) -> None:
        self.clock = clock
        self.instances = {
            i.id: i
            for i in (Inst("p0", "prfaas", "prefill"), Inst("l0", "local", "prefill"),
                      Inst("d0", "local", "decode"))
        }  # fmt: skip
        self.healthy = dict.fromkeys(self.instances, True)
        self.outstanding = dict.fromkeys(self.instances, 0)
        self.work = dict.fromkeys(self.instances, 0.0)

    async def sender_stats(self, instances: Sequence[str]) -> list[SenderCounters | None]:
        t = self.clock.t
        return [SenderCounters(5 * GBPS * t, -2.4e-7 if t <= 1.0 else 2e9, 0.0) for _ in instances]

    async def switch_role(self, instance: str, role: Role, switch_s: float) -> bool:
        raise AssertionError("a loop that only measures never switches roles")


async def test_measuring_only_fills_the_link_view_and_nothing_else() -> None:
    clock = StepClock()
    state = SchedulerState(clock, threshold=20000.0)  # type: ignore[arg-type]
    spec = SchedulerSpec(
        deployment=DEP, lengths=LognormalLengths(), output_tokens=1024, tpot_slo_s=0.025,
        threshold_step=500, n_prefill=1, n_local=2, replans=False,
    )  # fmt: skip
    loops = ControlLoops(spec, Sender(clock), state, clock, Scale())  # type: ignore[arg-type]
    heard: list[object] = []
    state.listen(heard.append)
    # nothing measured yet: unknown, not an idle link at the configured bandwidth
    assert (state.link_in_flight, state.bandwidth_estimate, state.link_delivered) == (None,) * 3
    seen = []
    task = asyncio.create_task(loops.run_short_term())
    for _ in range(200):
        await asyncio.sleep(0)
        if not seen or seen[-1][0] != clock.t:
            seen.append((clock.t, state.link_in_flight, state.bandwidth_estimate))
        if clock.t >= 12.0:
            break
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    after_first = next(s for s in seen if s[1] is not None)
    assert after_first[1] == 0.0  # the residue is clamped: never a negative queue
    assert after_first[2] is None  # one sample gives no rate yet
    last = seen[-1]
    assert last[1] == 2e9
    assert last[2] is not None and last[2] < 10 * GBPS  # the estimate followed 5 Gbps down
    assert state.link_delivered is not None and abs(state.link_delivered - 5 * GBPS) < 1.0
    assert state.threshold == 20000.0 and state.scarce is False  # not re-planned
    assert heard == [] and state.events == []  # no threshold events in the history
