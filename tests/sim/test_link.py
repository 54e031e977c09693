"""The link as flows sharing its bandwidth: max-min fair shares, producer caps, faults."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from testbed.sim.link import Flow, SimLink
from testbed.sim.loop import run_virtual

GB = 1e9


def _flow(done: dict[str, Any], name: str, size: float) -> Flow:
    return Flow(
        size,
        on_done=lambda at: done.__setitem__(name, at),
        on_fail=lambda why: done.__setitem__(name, why),
        sender=name,
    )


def _run(script: Any) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        done: dict[str, Any] = {}
        link = SimLink(loop, bandwidth=1 * GB, rtt=0.0, jitter=0.0, seed=1)
        await script(loop, link, done)
        await asyncio.sleep(1000)
        return done

    return run_virtual(main())


def test_two_flows_share_the_link_equally() -> None:
    async def script(loop: Any, link: SimLink, done: dict[str, Any]) -> None:
        link.start(_flow(done, "a", 1 * GB))
        link.start(_flow(done, "b", 3 * GB))

    done = _run(script)
    # both at 0.5 GB/s until a finishes (2 s), then b alone: 2 GB left at 1 GB/s
    assert done["a"] == pytest.approx(2.0)
    assert done["b"] == pytest.approx(4.0)


def test_a_flow_behind_a_slow_producer_leaves_the_rest_to_the_others() -> None:
    async def script(loop: Any, link: SimLink, done: dict[str, Any]) -> None:
        link.start(_flow(done, "slow", 1 * GB), duration=10.0)  # produced at 0.1 GB/s
        link.start(_flow(done, "bulk", 1.8 * GB))

    done = _run(script)
    assert done["slow"] == pytest.approx(10.0)  # never faster than its prefill
    assert done["bulk"] == pytest.approx(2.0)  # 0.9 GB/s: all the producer leaves


def test_a_bandwidth_change_retimes_the_active_flows() -> None:
    async def script(loop: Any, link: SimLink, done: dict[str, Any]) -> None:
        link.start(_flow(done, "a", 2 * GB))
        loop.call_at(1.0, link.set_bandwidth, 0.25 * GB)

    done = _run(script)
    assert done["a"] == pytest.approx(1.0 + 1 / 0.25)


def test_rtt_delays_the_last_byte_by_half_a_round_trip() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        link = SimLink(loop, bandwidth=1 * GB, rtt=0.2, jitter=0.0, seed=1)
        done: dict[str, Any] = {}
        link.start(_flow(done, "a", 1 * GB))
        await asyncio.sleep(10)
        return float(done["a"])

    assert run_virtual(main()) == pytest.approx(1.1)


def test_a_disabling_partition_breaks_transfers_and_refuses_new_ones() -> None:
    async def script(loop: Any, link: SimLink, done: dict[str, Any]) -> None:
        link.start(_flow(done, "a", 10 * GB))
        loop.call_at(1.0, link.cut, "disable", 0.0)
        loop.call_at(2.0, lambda: link.start(_flow(done, "b", 1 * GB)))
        loop.call_at(3.0, link.heal)
        loop.call_at(4.0, lambda: link.start(_flow(done, "c", 1 * GB)))

    done = _run(script)
    assert "reset" in done["a"]
    assert "unreachable" in done["b"]
    assert done["c"] == pytest.approx(5.0)  # healed: carried again


def test_a_black_hole_stalls_flows_and_times_them_out() -> None:
    async def script(loop: Any, link: SimLink, done: dict[str, Any]) -> None:
        link.start(_flow(done, "short", 2 * GB))
        loop.call_at(1.0, link.cut, "timeout", 5.0)
        loop.call_at(3.0, link.heal)  # before the timeout: it goes on where it was
        loop.call_at(10.0, lambda: link.start(_flow(done, "long", 1 * GB)))
        loop.call_at(10.5, link.cut, "timeout", 5.0)  # never healed

    done = _run(script)
    assert done["short"] == pytest.approx(4.0)  # 1 s before, 2 s stalled, 1 s after
    assert "timed out" in done["long"]


def test_resets_exhaust_the_senders_retries() -> None:
    async def script(loop: Any, link: SimLink, done: dict[str, Any]) -> None:
        link.set_resets(1.0, 0.5, True)  # every connection reset 0.5 s after data starts
        link.start(_flow(done, "a", 100 * GB))

    done = _run(script)
    assert "retries exhausted" in done["a"]


def _mixed_run(fast: bool, seed: int) -> dict[str, Any]:
    """Many layer-wise transfers (some overlapping enough to congest the link), a few prefix
    pulls with all their bytes there, a cancel and a bandwidth change."""
    import random

    rng = random.Random(seed)

    async def main() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        done: dict[str, Any] = {}
        link = SimLink(loop, bandwidth=1 * GB, rtt=0.01, jitter=0.002, seed=3, fast=fast)
        samples: list[float] = []
        counters: list[bool] = []
        cancelled = None
        for i in range(300):
            await asyncio.sleep(rng.expovariate(20.0))
            flow = _flow(done, f"f{i}", rng.uniform(0.001, 0.06) * GB)
            if i % 50 == 7:
                link.start(flow)  # a prefix pull: all its bytes there
            else:
                link.start(flow, duration=rng.uniform(0.05, 1.5))
            if i == 100:
                cancelled = flow
            if i == 120 and cancelled is not None:
                link.cancel(cancelled)
            if i == 200:
                link.set_bandwidth(0.5 * GB)
            samples.append(link.carried())
            samples.append(link.acked(f"f{i - 1}"))
            for sender in (f"f{i - 1}", f"f{i - 20}", "never"):  # busy, done, never sent
                counters.append(
                    link.counters(sender) == (link.acked(sender), link.in_queue(sender))
                )
        await asyncio.sleep(1000)
        assert all(counters) and len(counters) == 900  # one read of both, the same figures
        done["samples"] = samples
        done["delivered"] = link.carried()
        return done

    return run_virtual(main())


@pytest.mark.parametrize("seed", [1, 2])
def test_the_fast_mode_times_flows_as_the_general_water_filling(seed: int) -> None:
    fast, slow = _mixed_run(True, seed), _mixed_run(False, seed)
    assert fast.keys() == slow.keys()
    for key in fast:
        if key == "samples":
            assert fast[key] == pytest.approx(slow[key], rel=1e-6, abs=1.0)
        elif isinstance(slow[key], float):
            assert fast[key] == pytest.approx(slow[key], rel=1e-9, abs=1e-6), key
        else:
            assert fast[key] == slow[key], key


def test_an_uncongested_link_runs_each_flow_with_its_producer() -> None:
    async def script(loop: Any, link: SimLink, done: dict[str, Any]) -> None:
        link.start(_flow(done, "a", 0.3 * GB), duration=1.0)
        link.start(_flow(done, "b", 0.3 * GB), duration=2.0)
        assert link._fast  # both fit: no re-sharing among flows
        await asyncio.sleep(0.5)
        assert link.carried() == pytest.approx(0.15 * GB + 0.075 * GB)
        link.start(_flow(done, "c", 2 * GB))  # all there: takes what is left
        assert not link._fast

    done = _run(script)
    assert done["a"] == pytest.approx(1.0)
    assert done["b"] == pytest.approx(2.0)


def test_counters_of_senders_with_several_flows_equal_the_per_sender_reads() -> None:
    """`SimLink.counters` against `acked` and `in_queue` for senders with several flows under
    way, produced over different spans, and for one that never sent."""

    async def main() -> list[bool]:
        loop = asyncio.get_running_loop()
        link = SimLink(loop, bandwidth=1 * GB, rtt=0.0, jitter=0.0, seed=1, fast=True)
        done: dict[str, Any] = {}
        same: list[bool] = []
        for i in range(12):
            flow = Flow(0.3 * GB * (1 + i % 4), on_done=lambda at: None,
                        on_fail=lambda why: done.__setitem__("failed", why),
                        sender=f"p{i % 3}")  # fmt: skip
            link.start(flow, duration=0.2 * (1 + i % 5))
            await asyncio.sleep(0.13)
            senders = ["p0", "p1", "p2", "idle"]
            got = [link.counters(s) for s in senders]
            same.append(got == [(link.acked(s), link.in_queue(s)) for s in senders])
            same.append(sum(1 for a, q in got if q > 0) >= 1)  # something is queued
        return same

    assert all(run_virtual(main()))
