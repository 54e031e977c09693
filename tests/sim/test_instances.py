"""Prefill FIFO and analytic continuous-batching decode on the virtual loop."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from testbed.engine.emulated import wire_layer_bytes
from testbed.profiles import MODELS
from testbed.sim.dispatch import wire_kv_bytes
from testbed.sim.instances import PrefillJob, SimDecode, SimPrefill, Slot
from testbed.sim.loop import VirtualLoop, run_virtual

MODEL = MODELS["internal-1t-hybrid"]


def step(b: int) -> float:
    return 0.015 + 0.0005 * b


def test_decode_times_tokens_by_the_batch_without_a_timer_per_token() -> None:
    async def main() -> tuple[dict[str, Any], int]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualLoop)
        dec = SimDecode(loop, "d", step, bs_max=20)
        out: dict[str, Any] = {}
        timers = 0
        original = loop.call_at

        def counting(*a: Any, **k: Any) -> asyncio.TimerHandle:
            nonlocal timers
            timers += 1
            return original(*a, **k)

        loop.call_at = counting  # type: ignore[method-assign]
        dec.admit(Slot(1000, lambda f, last: out.__setitem__("a", (f, last))))
        late = Slot(10, lambda f, last: out.__setitem__("b", (f, last)))
        loop.call_at(0.1001, dec.admit, late)
        await asyncio.sleep(100)
        return out, timers

    out, timers = run_virtual(main())
    t1, t2 = step(1), step(2)
    # b arrives mid-step: it joins at the next boundary of a's batch
    joined = 7 * t1  # 0.1001 s falls in a's 7th step (0.0155 s each)
    assert out["b"][0] == pytest.approx(joined + t2)  # first token after its first step
    assert out["b"][1] == pytest.approx(joined + 10 * t2)
    a_first, a_last = out["a"]
    assert a_first == pytest.approx(t1)
    # a: 7 steps alone, 10 with b, the rest alone again
    assert a_last == pytest.approx(7 * t1 + 10 * t2 + (1000 - 17) * t1)
    assert timers < 20  # 1,010 tokens, a handful of timers


def test_decode_admits_at_most_bs_max_and_queues_the_rest() -> None:
    async def main() -> list[tuple[float, float]]:
        loop = asyncio.get_running_loop()
        dec = SimDecode(loop, "d", step, bs_max=2)
        done: list[tuple[float, float]] = []
        for _ in range(3):
            dec.admit(Slot(4, lambda f, last: done.append((f, last))))
        await asyncio.sleep(10)
        return done

    done = run_virtual(main())
    assert done[0][1] == pytest.approx(4 * step(2))
    assert done[2][0] == pytest.approx(4 * step(2) + step(1))  # it waited for a slot


def test_decode_ends_equal_requests_in_join_order_and_a_late_joiner_at_its_own_steps() -> None:
    """Requests that finish at the same step end in the order they joined; one that joins
    mid-batch has its first token one step after the boundary it joined at and its last after
    its own count of steps, at the step times of the batch it was in."""

    async def main() -> list[tuple[str, float, float]]:
        loop = asyncio.get_running_loop()
        dec = SimDecode(loop, "d", step, bs_max=8)
        done: list[tuple[str, float, float]] = []

        def slot(name: str, tokens: int) -> Slot:
            return Slot(tokens, lambda f, last: done.append((name, f, last)))

        dec.admit(slot("a", 5))
        dec.admit(slot("b", 5))
        await asyncio.sleep(2 * step(2) + 1e-4)  # mid third step: c joins at its end
        dec.admit(slot("c", 3))
        await asyncio.sleep(1)
        return done

    done = run_virtual(main())
    joined = 3 * step(2)
    ab_end = joined + 2 * step(3)
    assert [name for name, _, _ in done] == ["a", "b", "c"]
    assert done[0][1:] == pytest.approx((step(2), ab_end))
    assert done[1][1:] == pytest.approx((step(2), ab_end))
    assert done[2][1:] == pytest.approx((joined + step(3), ab_end + step(1)))


def test_decode_counts_tokens_through_cancel_pause_and_kill() -> None:
    """A request's tokens are the batch's steps since it joined: read mid-batch, after a
    cancel (the rest re-timed at once), across a pause, and frozen by a kill."""

    async def main() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        dec = SimDecode(loop, "d", step, bs_max=8)
        seen: dict[str, Any] = {}
        a = Slot(100, lambda f, last: seen.__setitem__("a", (f, last)))
        b = Slot(30, lambda f, last: seen.__setitem__("b", (f, last)))
        c = Slot(500, lambda f, last: seen.__setitem__("c", (f, last)))
        for s in (a, b, c):
            dec.admit(s)
        await asyncio.sleep(10 * step(3) + 1e-4)
        dec.sync(loop.time())
        seen["at 10"] = (a.generated, b.generated, c.generated, a.first_token)
        dec.cancel(a)  # leaves with its 10 tokens; b and c go on as a batch of two
        seen["a after cancel"] = a.generated
        await asyncio.sleep(5 * step(2) + 1e-4)
        dec.pause()
        seen["paused"] = (b.generated, c.generated)
        await asyncio.sleep(50)  # paused: no token
        dec.resume()
        await asyncio.sleep(15 * step(2) + 1e-4)  # b's 30th token, then c alone
        await asyncio.sleep(7 * step(1) + 1e-4)
        lost = dec.kill()
        seen["killed"] = ([s is c for s in lost], c.generated)
        return seen

    seen = run_virtual(main())
    assert seen["at 10"] == (10, 10, 10, pytest.approx(step(3)))
    assert seen["a after cancel"] == 10 and "a" not in seen
    assert seen["paused"] == (15, 15)
    assert seen["b"][1] == pytest.approx(10 * step(3) + 20 * step(2) + 50, abs=1e-3)
    assert seen["killed"] == ([True], 30 + 7)


def test_prefill_is_a_fifo_with_profile_times_and_pause_delays_it() -> None:
    async def main() -> list[tuple[str, float]]:
        loop = asyncio.get_running_loop()
        pre = SimPrefill(loop, "p", "prfaas", "h200x8", MODEL)
        log: list[tuple[str, float]] = []
        for name, tokens in (("a", 10_000), ("b", 20_000)):
            pre.submit(
                PrefillJob(
                    tokens,
                    on_start=lambda t, d, n=name: log.append((f"{n} start", t)),
                    on_end=lambda t, n=name: log.append((f"{n} end", t)),
                    on_fail=lambda r: None,
                )
            )
        loop.call_at(0.5, pre.pause)
        loop.call_at(2.5, pre.resume)
        await asyncio.sleep(100)
        return log

    log = dict(run_virtual(main()))
    ta = MODEL.prefill_time("h200x8", 10_000)
    tb = MODEL.prefill_time("h200x8", 20_000)
    assert ta > 0.5
    assert log["a end"] == pytest.approx(ta + 2.0)  # paused for 2 s mid-prefill
    assert log["b start"] == pytest.approx(log["a end"])
    assert log["b end"] == pytest.approx(log["a end"] + tb)


@pytest.mark.parametrize("byte_scale", [1.0, 7.0, 1000.0, 2000.0])
def test_kv_wire_bytes_in_closed_form_equal_the_engines_layer_sum(byte_scale: float) -> None:
    for tokens in (1, 2, 127, 128, 1000, 10_301, 19_500, 44_917, 128_000):
        want = sum(wire_layer_bytes(MODEL, tokens, byte_scale))
        assert wire_kv_bytes(MODEL, tokens, byte_scale) == want, tokens
