"""The emulated engine: profile-timed prefill that emits real (scaled) KV bytes layer by layer,
and profile-timed continuous-batching decode.

Durations come from the model profile, waited on the run's clock (testbed.clock); KV sizes from
S_kv split per layer divided by byte_scale. Nothing is computed, but every byte the engine says
it produced is put on a real socket by the caller, and every step waits on the real clock.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from testbed.clock import Clock
from testbed.engine.timing import TimingMeter, sleep_until
from testbed.profiles import ModelProfile

__all__ = ["DecodeBatcher", "DecodeSlot", "PrefillEngine", "wire_layer_bytes"]

# Below this wall-clock gap between layer completions, layers are emitted together: waking
# thousands of times a second costs more CPU than the timing precision is worth.
MIN_LAYER_WAKEUP_S = 0.002
CATCH_UP_S = 0.005
"""Wall seconds a prefill may start in the past: where it was waiting when the one before it
ended (back to back), it starts at that end, not when the worker got round to it, so the wake-up
lateness of one prefill and the worker's hand-over do not add up into lost capacity (the sim
has neither). Bounded: a longer stall (a paused process, a starved CPU) is real and stays."""


def wire_layer_bytes(model: ModelProfile, uncached_tokens: float, byte_scale: float) -> list[int]:
    """Bytes each layer puts on the wire for `uncached_tokens` of prefill: S_kv split / scale."""
    return [math.ceil(b / byte_scale) for b in model.layer_bytes(uncached_tokens)]


LayerSink = Callable[[int, int], Awaitable[None]]
"""Called with (layer index, wire bytes) as each layer's KV is complete."""


@dataclass
class PrefillEngine:
    """Prefill on one instance: T_prefill(hardware, l) on the run's clock, layers in order."""

    model: ModelProfile
    hardware: str
    clock: Clock
    byte_scale: float
    timing: TimingMeter = field(init=False)

    started_at: float = field(init=False, default=-float("inf"))
    """Wall instant (time.monotonic) the last prefill started, as `start_of` put it."""
    free_at: float = field(init=False, default=-float("inf"))
    """Wall instant the last prefill was scheduled to end."""

    def __post_init__(self) -> None:
        self.timing = TimingMeter(self.clock)

    def start_of(self, ready_at: float) -> float:
        """When a prefill whose work was ready at `ready_at` (wall) starts: now, or the
        scheduled end of the one before it when it was waiting for that and the end is at most
        CATCH_UP_S ago."""
        now = time.monotonic()
        back_to_back = max(ready_at, self.free_at)
        return back_to_back if now - CATCH_UP_S <= back_to_back <= now else now

    def duration(self, uncached_tokens: float) -> float:
        """Wall-clock seconds of one prefill."""
        return self.clock.wall(self.model.prefill_time(self.hardware, uncached_tokens))

    async def run(
        self, uncached_tokens: float, on_layer: LayerSink, ready_at: float | None = None
    ) -> None:
        """Prefill; each layer completes after an equal share of the prefill time. `ready_at`:
        the wall instant the work was ready (see `start_of`); None starts now."""
        sizes = wire_layer_bytes(self.model, uncached_tokens, self.byte_scale)
        n = len(sizes)
        total = self.duration(uncached_tokens)
        start = time.monotonic() if ready_at is None else self.start_of(ready_at)
        self.started_at, self.free_at = start, start + total
        per_layer = total / n
        group = max(1, math.ceil(MIN_LAYER_WAKEUP_S / per_layer)) if per_layer > 0 else n
        for first in range(0, n, group):
            last = min(first + group, n)
            self.timing.wake(await sleep_until(start + per_layer * last))
            for layer in range(first, last):
                await on_layer(layer, sizes[layer])
        self.timing.operation(time.monotonic() - start, total)


@dataclass
class DecodeSlot:
    """One request in (or waiting for) the decode batch."""

    request_id: str
    output_tokens: int
    emit: Callable[[int, float], None]
    """Called with (tokens generated since the last call, wall time of the last of them)."""
    generated: int = 0
    first_token_at: float | None = None
    last_token_at: float | None = None
    modelled: float = 0.0
    """Modelled wall seconds of this request's steps after its first token."""
    done: asyncio.Event = field(default_factory=asyncio.Event)


class DecodeBatcher:
    """Continuous batching up to BS_max with step time T_decode(batch) on the run's clock.

    Event-driven rather than one wake-up per step: between changes of the batch (an admission or
    a completion) every step has the same duration, so the loop sleeps straight to the next
    change or flush and credits the steps that fit, keeping step boundaries on an absolute clock.
    Tokens reach clients coalesced every `flush_interval` wall seconds.
    """

    def __init__(
        self,
        step_time: Callable[[int], float],
        bs_max: int,
        clock: Clock,
        flush_interval: float = 0.05,
    ) -> None:
        self._step_time = step_time
        self.bs_max = bs_max
        self.clock = clock
        self.flush_interval = flush_interval
        self.waiting: list[DecodeSlot] = []
        self.active: list[DecodeSlot] = []
        self.timing = TimingMeter(clock)
        self._wake = asyncio.Event()
        self.steps = 0

    def submit(self, slot: DecodeSlot) -> None:
        self.waiting.append(slot)
        self._wake.set()

    def cancel(self, slot: DecodeSlot) -> None:
        if slot in self.waiting:
            self.waiting.remove(slot)
        if slot in self.active:
            self.active.remove(slot)
        slot.done.set()

    def _admit(self) -> None:
        while self.waiting and len(self.active) < self.bs_max:
            self.active.append(self.waiting.pop(0))

    async def run(self) -> None:
        clock = time.monotonic()
        while True:
            self._admit()
            if not self.active:
                self._wake.clear()
                await self._wake.wait()
                clock = time.monotonic()
                continue
            batch = len(self.active)
            step = self.clock.wall(self._step_time(batch))
            remaining = min(s.output_tokens - s.generated for s in self.active)
            n = max(1, min(remaining, math.ceil(self.flush_interval / step)))
            if (self.waiting and len(self.active) < self.bs_max) or any(
                s.generated == 0 for s in self.active
            ):
                n = 1  # admit at the next step boundary; stream a first token at once
            deadline = clock + n * step
            self._wake.clear()
            woke_early = False
            if deadline > time.monotonic():
                try:
                    await asyncio.wait_for(self._wake.wait(), deadline - time.monotonic())
                    woke_early = True
                except TimeoutError:
                    pass
            if woke_early:
                # A new request is ready: finish only the step in progress, then re-batch.
                done_steps = min(n, max(1, math.ceil((time.monotonic() - clock) / step)))
                deadline = clock + done_steps * step
                n = done_steps
            self.timing.wake(await sleep_until(deadline))
            clock = deadline
            self.steps += n
            now = time.monotonic()
            for slot in list(self.active):
                # n never exceeds any active request's remaining tokens (see above)
                if slot.first_token_at is None:
                    slot.first_token_at = now
                    slot.modelled += (n - 1) * step
                else:
                    slot.modelled += n * step
                slot.generated += n
                slot.last_token_at = now
                slot.emit(n, now)
                if slot.generated >= slot.output_tokens:
                    self.active.remove(slot)
                    self.timing.operation(now - slot.first_token_at, slot.modelled)
                    slot.done.set()
