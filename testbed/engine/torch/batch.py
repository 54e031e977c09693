"""Continuous batching for the tiny real model's decode (`engine: torch`), torch-free at import.

Every step decodes one token for each active request, one after another on a one-thread
executor (the event loop keeps receiving KV meanwhile), and the step is padded to the profile's
T_decode(batch) / time_scale (or counted late), like the emulated batcher. Batching is
sequential per request (no stacked batched kernel yet), so a step's compute grows with the
batch while its budget grows much less: at a high time_scale most steps are late, and the
pacer's statistics say so.
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
    from testbed.engine.torch.engine import TorchDecodeEngine
    from testbed.engine.torch.kvstate import KVState

__all__ = ["TorchDecodeBatcher", "TorchSlot"]


@dataclass
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


class TorchDecodeBatcher:
    """Continuous batching up to `bs_max`, one paced step at a time."""

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

    def _step_all(self, batch: list[TorchSlot]) -> list[int | str]:
        """One decode step for each request (runs on the executor thread)."""
        out: list[int | str] = []
        for slot in batch:
            try:
                out.append(self.engine.model.decode_step(slot.state, slot.ids[-1]))
            except ValueError as exc:  # e.g. the context is full: that request fails alone
                out.append(str(exc))
        return out

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while self.waiting and len(self.active) < self.bs_max:
                self.active.append(self.waiting.popleft())
            if not self.active:
                self.wake.clear()
                await self.wake.wait()
                continue
            batch = list(self.active)
            started = time.monotonic()
            results = await loop.run_in_executor(self.executor, self._step_all, batch)
            await self.pacer.pace("decode_step", started, self.budget.decode_step_s(len(batch)))
            now = time.monotonic()
            for slot, tok in zip(batch, results, strict=True):
                if slot not in self.active:  # cancelled while the step ran
                    continue
                if isinstance(tok, str):
                    slot.error = tok
                else:
                    slot.ids.append(tok)
                    slot.last_token_at = now
                    slot.emit(1)
                if slot.error is not None or len(slot.ids) >= slot.output_tokens:
                    self.active.remove(slot)
                    slot.done.set()
