"""The emulated engine keeps its modelled timing and emits every KV byte, layer by layer."""

import asyncio
import time

from testbed.clock import LiveClock
from testbed.engine.emulated import DecodeBatcher, DecodeSlot, PrefillEngine, wire_layer_bytes
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
