"""`SimCluster.sender_stats`: what the short-term loop reads of the PrfaaS senders every tick,
in wire bytes, None for a sender that would not answer (a dead or paused worker, or no link).
A sender answers by `SimInstance.answers`, the health poll's rule; here it is held to `alive`,
`paused` and `Scale.wire_bytes`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from testbed.clock import Scale
from testbed.profiles import MODELS
from testbed.scheduler.state import SchedulerState
from testbed.sim.cluster import SimCluster, SimInstance

MODEL = "internal-1t-hybrid"


@dataclass
class Engine:
    alive: bool = True
    paused_at: float | None = None


class Link:
    def counters(self, sender: str) -> tuple[float, float]:
        return {"a": (12_345.0, 678.0), "b": (1.0, 0.0)}.get(sender, (5e9, 2.5e6))


def _cluster(instances: list[SimInstance], link: Any, scale: Scale) -> SimCluster:
    class Clock:
        def now(self) -> float:
            return 0.0

    state = SchedulerState(Clock(), threshold=None)  # type: ignore[arg-type]
    return SimCluster(
        asyncio.new_event_loop(), Clock(), instances, link, state, scale,  # type: ignore[arg-type]
        1.0, MODELS[MODEL],
    )  # fmt: skip


def _inst(iid: str, prefill: Engine | None, decode: Engine | None = None) -> SimInstance:
    role = "prefill" if prefill is not None else "decode"
    return SimInstance(iid, "prfaas", role, False, prefill, decode)  # type: ignore[arg-type]


INSTANCES = [
    _inst("a", Engine()),
    _inst("b", Engine(), Engine(alive=False)),  # switchable: its prefill engine answers
    _inst("dead", Engine(alive=False)),
    _inst("paused", Engine(paused_at=3.0)),
    _inst("decode", None, Engine()),
    _inst("none", None),
    _inst("decode-paused", None, Engine(paused_at=0.0)),
]


@pytest.mark.parametrize("byte_scale", [1.0, 1000.0, 3.0])
def test_each_sender_answers_in_wire_bytes_unless_its_worker_would_not(byte_scale: float) -> None:
    scale = Scale(byte_scale=byte_scale)
    cluster = _cluster(INSTANCES, Link(), scale)
    ids = [i.id for i in INSTANCES]
    got = asyncio.run(cluster.sender_stats(ids))
    link = Link()
    for inst, counters in zip(INSTANCES, got, strict=True):
        if not inst.alive or inst.paused:
            assert counters is None, inst.id
            continue
        acked, in_queue = link.counters(inst.id)
        assert counters is not None, inst.id
        assert counters.bytes_acked == scale.wire_bytes(acked)
        assert counters.in_flight_bytes == scale.wire_bytes(in_queue)
        assert counters.queued_bytes == 0.0
    assert [c is None for c in got] == [False, False, True, True, False, True, True]


def test_no_link_no_answers() -> None:
    cluster = _cluster(INSTANCES, None, Scale())
    assert asyncio.run(cluster.sender_stats(["a", "decode"])) == [None, None]


def test_answers_is_alive_and_not_paused() -> None:
    """The health poll and the sender counters share this rule."""
    assert [i.answers for i in INSTANCES] == [not i.paused and i.alive for i in INSTANCES]
    assert [i.answers for i in INSTANCES] == [True, True, False, False, True, False, False]
