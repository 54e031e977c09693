"""The scheduler's control loops (scheduler.loops) against a fake router: canned sender
counters, dicts for the load accounting, a clock that moves only when the loop sleeps. No
processes, no sockets: what the loops decide from what they are shown."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import pytest

from testbed.clock import Scale
from testbed.config import DeploymentConfig, LognormalLengths, LongTermConfig, ShortTermConfig
from testbed.profiles import MODELS
from testbed.scheduler.cluster import Role, SenderCounters
from testbed.scheduler.loops import ControlLoops
from testbed.scheduler.spec import SchedulerSpec
from testbed.scheduler.state import POLICY, SchedulerEvent, SchedulerState

GBPS = 1e9 / 8
DEP = DeploymentConfig.model_validate(
    {
        "kind": "prfaas-pd",
        "prfaas": {"hardware": "h200x8", "instances": 2},
        "local": {"hardware": "h20x8", "instances": 4, "prefill": 1, "decode": 3},
        "link": {"bandwidth": "100Gbps", "rtt": "10ms"},
    }
)


class FakeClock:
    """Real-world time that moves only when the loop sleeps; it stops the loop at `limit`."""

    def __init__(self, limit: float = 60.0, per_wall_s: float = 1.0) -> None:
        self.t = 0.0
        self.limit = limit
        self.per_wall_s = per_wall_s

    def now(self) -> float:
        return self.t

    def real(self, wall_s: float) -> float:
        return wall_s * self.per_wall_s

    async def sleep(self, real_s: float) -> None:
        if self.t >= self.limit:
            await asyncio.Event().wait()  # the test has seen enough: hold the loop here
        self.t += real_s
        await asyncio.sleep(0)


@dataclass(frozen=True)
class Inst:
    id: str
    cluster: str
    role: str
    switchable: bool = False


class FakeCluster:
    """The router as the loops see it (scheduler.cluster.Cluster)."""

    def __init__(self, instances: list[Inst], state: SchedulerState) -> None:
        self.instances = {i.id: i for i in instances}
        self.healthy = dict.fromkeys(self.instances, True)
        self.outstanding = dict.fromkeys(self.instances, 0)
        self.work = dict.fromkeys(self.instances, 0.0)
        self.state = state
        self.feed: dict[str, SenderCounters | None] = {}
        self.switches: list[tuple[str, str, bool]] = []
        """(instance, role, draining when asked)."""
        self.refuse = False

    async def sender_stats(self, instances: Sequence[str]) -> list[SenderCounters | None]:
        return [self.feed.get(i) for i in instances]

    async def switch_role(self, instance: str, role: Role, switch_s: float) -> bool:
        self.switches.append((instance, role, instance in self.state.draining))
        if self.refuse:
            return False
        self.instances[instance] = replace(self.instances[instance], role=role)
        return True


def _setup(
    clock: FakeClock, long_term: LongTermConfig | None = None, instances: list[Inst] | None = None
) -> tuple[ControlLoops, FakeCluster, SchedulerState]:
    spec = SchedulerSpec(
        deployment=DEP,
        lengths=LognormalLengths(),
        output_tokens=1024,
        tpot_slo_s=0.025,
        threshold_step=500,
        n_prefill=1,
        short_term=ShortTermConfig(queue_balance=False),
        long_term=long_term,
        n_local=4,
    )
    state = SchedulerState(clock, threshold=None)  # type: ignore[arg-type]
    cluster = FakeCluster(
        instances
        or [
            Inst("p0", "prfaas", "prefill"),
            Inst("p1", "prfaas", "prefill"),
            Inst("l0", "local", "prefill"),
            *(Inst(f"d{i}", "local", "decode", switchable=True) for i in range(3)),
        ],
        state,
    )
    loops = ControlLoops(spec, cluster, state, clock, Scale())  # type: ignore[arg-type]
    return loops, cluster, state


async def _until(cond, clock: FakeClock, task: asyncio.Task[None]) -> None:  # type: ignore[no-untyped-def]
    """Let the loop run until `cond()` (bounded in steps; the fake clock stops it anyway)."""
    for _ in range(4000):
        if cond() or task.done():
            break
        await asyncio.sleep(0.005)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_link_that_delivers_a_fraction_raises_the_threshold() -> None:
    clock = FakeClock(limit=40.0)
    loops, cluster, state = _setup(clock)
    heard: list[SchedulerEvent] = []
    state.listen(heard.append)
    drop_at, nominal, low = 5.0, 100 * GBPS, 1 * GBPS

    class Feed(dict[str, SenderCounters | None]):
        """Each of the two senders: half the link; past `drop_at` it delivers 1% of nominal
        with two seconds of KV standing in front of it."""

        def get(self, key: str, default: object = None) -> SenderCounters | None:  # type: ignore[override]
            t = clock.t
            if t <= drop_at:
                return SenderCounters(nominal * t / 2, 0.0, 0.0)
            acked = (nominal * drop_at + low * (t - drop_at)) / 2
            return SenderCounters(acked, low, 0.0)

    cluster.feed = Feed()
    task = asyncio.create_task(loops.run_short_term())

    def moved() -> bool:
        return any(e.data.get("why") == "bandwidth moved" for e in state.events)

    await _until(moved, clock, task)
    start = state.events[0]
    assert start.kind == "threshold" and start.data["why"] == "start"
    assert start.data["threshold_tokens"] > 0
    drop = next(e for e in state.events if e.data.get("why") == "bandwidth moved")
    assert drop.t > drop_at
    assert drop.data["bandwidth_gbps"] < 50  # the estimate followed the delivered rate down
    assert drop.data["scarce"] is True
    assert drop.data["threshold_tokens"] > start.data["threshold_tokens"]  # fewer to PrfaaS
    assert state.bandwidth_estimate is not None and state.bandwidth_estimate < nominal / 2
    assert state.scarce is True
    policies = [e.data["threshold_tokens"] for e in heard if e.kind == POLICY]
    assert policies[0] == start.data["threshold_tokens"]
    assert drop.data["threshold_tokens"] in policies  # the router's snapshot reads it


async def test_no_sender_answering_changes_nothing() -> None:
    clock = FakeClock(limit=10.0)
    loops, _cluster, state = _setup(clock)
    task = asyncio.create_task(loops.run_short_term())
    await _until(lambda: clock.t >= 10.0, clock, task)
    assert [e.data["why"] for e in state.events] == ["start"]
    assert state.bandwidth_estimate == DEP.link.bandwidth
    assert loops.estimates == type(loops.estimates)()  # no samples taken


def test_waits_and_pressure_skip_draining_and_down_instances() -> None:
    loops, cluster, state = _setup(FakeClock())
    cluster.outstanding.update(p0=2, p1=4, d0=3, d1=1, d2=2)
    cluster.work.update(p0=20_000.0, p1=40_000.0)
    prfaas, local = loops.waits()
    model = MODELS[DEP.model]
    assert prfaas == pytest.approx(2 * model.prefill_time("h200x8", 10_000))  # least loaded
    assert local == 0.0
    state.draining.add("l0")
    assert loops.waits()[1] == math.inf  # no local prefill instance to take it
    cluster.healthy["p0"] = False
    assert loops.waits()[0] == pytest.approx(4 * model.prefill_time("h200x8", 10_000))
    pressure = loops.pressure()
    assert pressure.prefill == 4.0  # p1 only: p0 down, l0 draining
    assert pressure.decode == pytest.approx(6 / (3 * loops.bs_max))


async def test_convert_drains_switches_and_records_the_new_split() -> None:
    loops, cluster, state = _setup(FakeClock(), long_term=LongTermConfig())
    cluster.work.update(d0=500.0, d1=100.0, d2=300.0)
    await loops.convert(target_prefill=2)
    assert cluster.switches == [("d1", "prefill", True)]  # least work first, drained when asked
    assert cluster.instances["d1"].role == "prefill"
    assert state.draining == set()
    kinds = [e.kind for e in state.events]
    assert kinds == ["drain", "switched", "split"]
    split = state.events[-1].data
    assert split == {"n_prefill": 2, "n_decode": 2, "converted": ["d1"]}
    assert loops.n_prefill == 2


async def test_a_refused_switch_keeps_the_role_and_the_split() -> None:
    loops, cluster, state = _setup(FakeClock(), long_term=LongTermConfig())
    cluster.refuse = True
    await loops.convert(target_prefill=2)
    assert cluster.instances["d0"].role == "decode"
    assert state.draining == set()
    failed = [e.data for e in state.events if e.kind == "switch_failed"]
    assert failed == [{"instance": "d0", "reason": "role switch refused"}]
    assert state.events[-1].data["converted"] == [] and loops.n_prefill == 1


async def test_a_drain_that_never_empties_times_out_without_switching() -> None:
    clock = FakeClock(per_wall_s=100.0)  # every drain poll is 5 real-world seconds
    loops, cluster, state = _setup(clock, long_term=LongTermConfig(drain_timeout=12.0))
    cluster.outstanding.update(d0=1, d1=1, d2=1)  # requests that never end
    await loops.convert(target_prefill=2)
    assert cluster.switches == []
    failed = [e.data for e in state.events if e.kind == "switch_failed"]
    assert failed == [{"instance": "d0", "reason": "drain timed out"}]
    assert state.draining == set() and cluster.instances["d0"].role == "decode"
    assert 12.0 < clock.t <= 20.0  # gave up on the scheduler's clock, not the wall's


async def test_a_link_sample_sums_the_senders_that_answered_in_real_bytes() -> None:
    clock = FakeClock()
    loops, cluster, _state = _setup(clock)
    loops.scale = Scale(byte_scale=1000.0)
    senders = loops.senders()
    assert senders == ["p0", "p1"]
    assert await loops.sample_link(senders) is None  # neither answered
    cluster.feed = {"p0": SenderCounters(10.0, 2.0, 0.5), "p1": None}
    one = await loops.sample_link(senders)
    assert one is not None and (one.bytes_acked, one.inflight_bytes) == (10_000.0, 2_500.0)
    cluster.feed["p1"] = SenderCounters(5.0, -3.0, 0.0)  # a counter's float residue below 0
    both = await loops.sample_link(senders)
    assert both is not None and both.bytes_acked == 15_000.0
    assert both.inflight_bytes == 0.0  # never a negative queue


@pytest.mark.parametrize("seed", range(3))
def test_each_waits_is_the_profiles_prefill_time_of_the_mean_length(seed: int) -> None:
    """`stage_loads` writes `ModelProfile.prefill_time` out: n x T_prefill(work / n) of the
    least loaded instance, bit for bit, whatever the work (none, a fraction of a token, a
    million tokens)."""
    import random

    rng = random.Random(seed)
    loops, cluster, _ = _setup(FakeClock())
    model = MODELS[DEP.model]
    for _ in range(200):
        for iid in ("p0", "p1", "l0"):
            n = rng.choice([0, 1, 2, 7])
            cluster.outstanding[iid] = n
            cluster.work[iid] = rng.choice([0.0, 0.25, 511.0, rng.uniform(1, 1e6)]) if n else 0.0

        def wait(iid: str, hw: str) -> float:
            n = cluster.outstanding[iid]
            return n * model.prefill_time(hw, cluster.work[iid] / n) if n else 0.0

        assert loops.waits() == (
            min(wait("p0", "h200x8"), wait("p1", "h200x8")),
            wait("l0", "h20x8"),
        )


def test_a_model_without_the_clusters_prefill_curve_fails_as_the_profile_does() -> None:
    loops, cluster, _ = _setup(FakeClock())
    loops.prefill_curves["prfaas"] = None  # as for hardware the model has no profile for
    cluster.outstanding["p0"] = 0
    assert loops.waits()[0] == 0.0  # nothing outstanding: no curve needed
    cluster.outstanding["p0"], cluster.work["p0"] = 2, 1_000.0
    with pytest.raises(KeyError, match="h200x8"):
        loops.waits()
