"""Continuous batching for the tiny real model's decode (`engine: torch`), torch-free at import.

Every step is one batched forward pass for all active requests (engine.torch.batched), run on a
one-thread executor so the event loop keeps receiving KV meanwhile, and padded to the profile's
T_decode(batch) / time_scale (or counted late), like the emulated batcher. A pass computes a
fixed number of rows (`batched.ROWS`), so a step costs about the same for 1 and 20 requests; a
batch above ROWS runs one pass per ROWS requests. A request's KV is copied into a row when it
joins the batch, and the row is freed when it leaves (finished, failed or cancelled).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from testbed.engine.torch.pacing import CpuPacer, ProfileBudget

if TYPE_CHECKING:
    from testbed.engine.torch.batched import DecodeBatch
    from testbed.engine.torch.engine import TorchDecodeEngine
    from testbed.engine.torch.kvstate import KVState

__all__ = ["TorchDecodeBatcher", "TorchSlot"]


@dataclass(eq=False)
class TorchSlot:
    """One request in (or waiting for) the decode batch."""

    request_id: str
    state: KVState
    ids: list[int]
    """[first token, decoded tokens...]; the last one is the next step's input."""
    output_tokens: int
    emit: Callable[[int], None]
    """Called with 1 for every token (the first one when the slot is submitted)."""
    done: asyncio.Event = field(default_factory=asyncio.Event)
    first_token_at: float | None = None
    last_token_at: float | None = None
    error: str | None = None
    place: tuple[DecodeBatch, int] | None = None
    """The pass and row holding this request's KV while it is in the batch."""


class TorchDecodeBatcher:
    """Continuous batching up to `bs_max`, one paced batched step at a time."""

    def __init__(
        self,
        engine: TorchDecodeEngine,
        budget: ProfileBudget,
        pacer: CpuPacer,
        bs_max: int,
        executor: Executor,
    ) -> None:
        self.engine = engine
        self.budget = budget
        self.pacer = pacer
        self.bs_max = bs_max
        self.executor = executor
        self.active: list[TorchSlot] = []
        self.waiting: deque[TorchSlot] = deque()
        self.wake = asyncio.Event()
        self.passes: list[DecodeBatch] = []
        self._stepping = False

    def submit(self, slot: TorchSlot) -> None:
        now = time.monotonic()
        slot.first_token_at = slot.last_token_at = now
        slot.emit(1)  # the first token came with the request (from prefill)
        if len(slot.ids) >= slot.output_tokens:
            slot.done.set()
            return
        self.waiting.append(slot)
        self.wake.set()

    def cancel(self, slot: TorchSlot) -> None:
        with contextlib.suppress(ValueError):
            self.active.remove(slot)
        with contextlib.suppress(ValueError):
            self.waiting.remove(slot)
        if not self._stepping:  # during a step the row is freed once the step is over
            self._release(slot)

    def _release(self, slot: TorchSlot) -> None:
        if slot.place is not None:
            batch, row = slot.place
            batch.remove(row)
            slot.place = None

    def _join(self, slot: TorchSlot) -> None:
        """Copy the request's KV into a free row of a pass (a new pass if all are full)."""
        from testbed.engine.torch.batched import DecodeBatch

        batch = next((b for b in self.passes if b.free_rows()), None)
        if batch is None:
            batch = DecodeBatch(self.engine.model)
            self.passes.append(batch)
        try:
            slot.place = (batch, batch.add(slot, slot.state, slot.ids[-1]))
        except ValueError as exc:  # e.g. the context is already full: that request fails
            slot.error = str(exc)
            slot.done.set()
            return
        self.active.append(slot)

    def _step_all(self, passes: list[DecodeBatch]) -> list[list[int]]:
        """One batched step per pass (runs on the executor thread)."""
        return [b.step() for b in passes]

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        limit = self.engine.model.config.max_positions
        while True:
            while self.waiting and len(self.active) < self.bs_max:
                self._join(self.waiting.popleft())
            for slot in list(self.active):  # a full context fails that request alone
                assert slot.place is not None
                if int(slot.place[0].n[slot.place[1]]) >= limit:
                    slot.error = "context is full"
                    self.active.remove(slot)
                    self._release(slot)
                    slot.done.set()
            # Passes left empty are dropped, but one is kept: a fresh pass allocates its tensors
            # and its first step runs cold, which a step's budget should not pay for.
            self.passes = [
                b for i, b in enumerate(self.passes) if i == 0 or b.free_rows() < len(b.rows)
            ]
            if not self.active:
                self.wake.clear()
                await self.wake.wait()
                continue
            batch = list(self.active)
            passes = list(self.passes)
            started = time.monotonic()
            self._stepping = True
            try:
                results = await loop.run_in_executor(self.executor, self._step_all, passes)
            finally:
                self._stepping = False
            await self.pacer.pace("decode_step", started, self.budget.decode_step_s(len(batch)))
            now = time.monotonic()
            out = {id(b): r for b, r in zip(passes, results, strict=True)}
            for slot in batch:
                if slot not in self.active:  # cancelled while the step ran
                    self._release(slot)
                    continue
                assert slot.place is not None
                pass_, row = slot.place
                slot.ids.append(out[id(pass_)][row])
                slot.last_token_at = now
                slot.emit(1)
                if len(slot.ids) >= slot.output_tokens:
                    self.active.remove(slot)
                    self._release(slot)
                    slot.done.set()
