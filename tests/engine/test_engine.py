"""The emulated engine keeps its modelled timing and emits every KV byte, layer by layer."""

import asyncio
import time

import pytest

from testbed.clock import LiveClock
from testbed.engine import emulated
from testbed.engine.emulated import (
    CATCH_UP_S,
    DecodeBatcher,
    DecodeSlot,
    PrefillEngine,
    wire_layer_bytes,
)
from testbed.profiles import MODELS

MODEL = MODELS["internal-1t-hybrid"]


async def test_prefill_emits_every_layer_in_order_over_the_modelled_time() -> None:
    engine = PrefillEngine(MODEL, "h200x8", LiveClock(time_scale=20.0), byte_scale=1000.0)
    seen: list[tuple[int, int, float]] = []

    async def sink(layer: int, nbytes: int) -> None:
        seen.append((layer, nbytes, time.monotonic()))

    start = time.monotonic()
    await engine.run(32 * 1024, sink)
    elapsed = time.monotonic() - start
    assert [s[0] for s in seen] == list(range(MODEL.n_layers))
    assert [s[1] for s in seen] == wire_layer_bytes(MODEL, 32 * 1024, 1000.0)
    assert elapsed >= 1.84 / 20  # Table 5: 1.84 s at 32K, scaled by time_scale
    # layers arrive progressively, not all at the end (layer-wise pipelining)
    assert seen[0][2] - start < 0.5 * elapsed
    assert engine.timing.stats()["operations"] == 1


async def test_back_to_back_prefills_lose_no_time_to_the_hand_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The second prefill was waiting when the first ended: it starts at the first's scheduled
    # end, however late the worker gets to it, so n prefills take n x T. The catch-up bound is
    # widened so that the machine's load cannot decide the test (the bound has its own test).
    monkeypatch.setattr(emulated, "CATCH_UP_S", 60.0)
    engine = PrefillEngine(MODEL, "h200x8", LiveClock(time_scale=20.0), byte_scale=1000.0)

    async def sink(layer: int, nbytes: int) -> None:
        pass

    ready = time.monotonic()
    await engine.run(8 * 1024, sink, ready_at=ready)
    first_end = engine.free_at
    time.sleep(0.003)  # the worker's hand-over, stretched (a busy event loop)
    await engine.run(8 * 1024, sink, ready_at=ready)
    assert engine.started_at == first_end
    assert engine.free_at == first_end + engine.duration(8 * 1024)
    # without ready_at a prefill starts when it is called, whatever came before
    before = time.monotonic()
    await engine.run(8 * 1024, sink)
    assert engine.started_at >= before


def test_start_of_catches_up_only_within_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    now = 1000.0
    monkeypatch.setattr(emulated.time, "monotonic", lambda: now)
    engine = PrefillEngine(MODEL, "h200x8", LiveClock(time_scale=20.0), byte_scale=1000.0)
    # back to back, the worker a little late: the previous prefill's end
    engine.free_at = now - CATCH_UP_S / 2
    assert engine.start_of(ready_at=now - 20.0) == now - CATCH_UP_S / 2
    # a stall longer than the bound (a paused process, a starved CPU) is real time lost
    engine.free_at = now - 10 * CATCH_UP_S
    assert engine.start_of(ready_at=now - 20.0) == now
    # an idle engine starts a request when it arrived, if the worker came to it at once
    engine.free_at = now - 20.0
    assert engine.start_of(ready_at=now - CATCH_UP_S / 2) == now - CATCH_UP_S / 2
    # never in the future
    assert engine.start_of(ready_at=now + 1.0) == now


def test_wire_bytes_are_scaled_kv_size() -> None:
    sizes = wire_layer_bytes(MODEL, 44_000, 1000.0)
    assert abs(sum(sizes) - MODEL.kv_bytes(44_000) / 1000) <= len(sizes)


async def test_decode_batch_never_exceeds_bs_max_and_every_token_is_emitted() -> None:
    batcher = DecodeBatcher(
        lambda b: 0.010 + 0.001 * b, bs_max=3, clock=LiveClock(time_scale=10.0), flush_interval=0.01
    )
    task = asyncio.create_task(batcher.run())
    got: dict[str, int] = {}
    max_batch = 0

    def emitter(rid: str):  # type: ignore[no-untyped-def]
        def emit(k: int, _t: float) -> None:
            nonlocal max_batch
            got[rid] = got.get(rid, 0) + k
            max_batch = max(max_batch, len(batcher.active))

        return emit

    slots = [DecodeSlot(f"r{i}", 20 + i, emitter(f"r{i}")) for i in range(7)]
    for s in slots:
        batcher.submit(s)
    async with asyncio.timeout(20):
        for s in slots:
            await s.done.wait()
    task.cancel()
    assert got == {f"r{i}": 20 + i for i in range(7)}
    assert max_batch <= 3
    for s in slots:
        assert s.first_token_at is not None and s.last_token_at is not None
        assert s.last_token_at > s.first_token_at
    stats = batcher.timing.stats()
    assert stats["operations"] == 7
