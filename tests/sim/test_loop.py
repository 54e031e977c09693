"""The virtual-time loop: time jumps to the next timer, executors run inline, a stall is said."""

from __future__ import annotations

import asyncio
import time

import pytest

from testbed.sim.loop import SimulationStalled, VirtualClock, run_virtual


def test_time_jumps_to_the_next_timer_without_waiting() -> None:
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        clock = VirtualClock(loop)
        seen = [clock.now()]
        await clock.sleep(3600.0)
        seen.append(clock.now())
        await clock.sleep_until(7200.5)
        seen.append(clock.now())
        async with asyncio.timeout(10):  # asyncio's own timeouts run on virtual time too
            await asyncio.sleep(9.0)
        seen.append(loop.time())
        return seen

    before = time.process_time()
    assert run_virtual(main()) == [0.0, 3600.0, 7200.5, 7209.5]
    assert time.process_time() - before < 5  # hours of virtual time, not of CPU


def test_to_thread_runs_inline_and_costs_no_virtual_time() -> None:
    async def main() -> tuple[int, float]:
        await asyncio.sleep(5)
        result = await asyncio.to_thread(lambda: 41 + 1)
        return result, asyncio.get_running_loop().time()

    assert run_virtual(main()) == (42, 5.0)


def test_timers_at_the_same_time_run_in_the_order_they_were_set() -> None:
    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        order: list[int] = []
        for i in range(20):
            loop.call_at(10.0, order.append, i)
        await asyncio.sleep(11)
        return order

    assert run_virtual(main()) == list(range(20))


def test_cancelled_timers_never_run_and_are_dropped_from_the_heap() -> None:
    """Most of 300 timers cancelled: the loop rebuilds its heap without them (as asyncio's
    does), and the rest still run in time order, ties first in first out."""

    async def main() -> tuple[list[int], int]:
        loop = asyncio.get_running_loop()
        ran: list[int] = []
        timers = [loop.call_at(1.0 + i % 7, ran.append, i) for i in range(300)]
        for i, t in enumerate(timers):
            if i % 3:
                t.cancel()
        await asyncio.sleep(0.5)  # one turn of the loop with the cancelled majority
        held = len(loop._scheduled)  # type: ignore[attr-defined]
        await asyncio.sleep(10)
        return ran, held

    ran, held = run_virtual(main())
    kept = [i for i in range(300) if i % 3 == 0]
    assert ran == sorted(kept, key=lambda i: (1.0 + i % 7, i))
    assert held <= len(kept) + 1  # the 200 cancelled ones are gone (plus the sleep's timer)


def test_waiting_on_what_nothing_will_set_is_a_stall_not_a_hang() -> None:
    async def main() -> None:
        await asyncio.Event().wait()

    with pytest.raises(SimulationStalled):
        run_virtual(main())


def test_a_simulation_runs_with_young_collections_and_restores_the_collector() -> None:
    """What a run keeps is not rescanned by full collections while it runs (the sim's cost grew
    faster than its trace), and the process's collector is as it was afterwards, even when the
    run fails."""
    import gc

    from testbed.sim.loop import YOUNG_THRESHOLDS

    before = gc.get_threshold()
    seen: list[tuple[int, int, int]] = []

    async def main() -> None:
        seen.append(gc.get_threshold())
        assert gc.get_freeze_count() > 0  # what existed before the run is frozen
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run_virtual(main())
    assert seen == [YOUNG_THRESHOLDS]
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
