"""Prefill and decode instances on the sim: the emulated engine's cost models, as events.

Prefill: one FIFO per instance, one prefill at a time, each taking T_prefill(hardware, l) of the
model profile (the same call `engine.emulated.PrefillEngine` waits on); a job's KV is produced
evenly over its prefill (layer by layer), which is what the link's flows are capped by.

Decode: continuous batching up to BS_max with step time T_decode(batch) from the profile, as
`engine.emulated.DecodeBatcher` does live: a request whose KV is complete joins the batch at the
next step boundary (at once if the batch is empty), its first token comes at the end of its
first step, and every step of a batch of b takes T_decode(b). Between two changes of the batch
(an admission or a completion) every step is the same, so the tokens of every request are
computed when the batch changes, never stepped: one timer per change, not per token.

Kill fails everything the instance holds; pause freezes it (a running prefill or the decode
batch resumes where it was, later by the pause); restart brings it back empty.
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from testbed.profiles import ModelProfile

__all__ = ["PrefillJob", "SimDecode", "SimPrefill", "Slot"]


@dataclass(eq=False)
class PrefillJob:
    tokens: int
    on_start: Callable[[float, float], None]
    """(start time, duration) when the prefill begins."""
    on_end: Callable[[float], None]
    on_fail: Callable[[str], None]
    started: float | None = None
    ends: float | None = None
    done: bool = False


class SimPrefill:
    """One prefill instance: a FIFO of jobs run one at a time."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, iid: str, cluster: str, hardware: str,
        model: ModelProfile,
    ) -> None:  # fmt: skip
        self.loop = loop
        self.id, self.cluster, self.hardware, self.model = iid, cluster, hardware, model
        self.queue: deque[PrefillJob] = deque()
        self.running: PrefillJob | None = None
        self.alive = True
        self.paused_at: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.operations = 0

    def duration(self, tokens: int) -> float:
        return self.model.prefill_time(self.hardware, tokens)

    def submit(self, job: PrefillJob) -> None:
        self.queue.append(job)
        if self.running is None and self.paused_at is None:
            self._next()

    def _next(self) -> None:
        while self.queue:
            job = self.queue.popleft()
            if job.done:
                continue
            now = self.loop.time()
            d = self.duration(job.tokens)
            job.started, job.ends = now, now + d
            self.running = job
            self._timer = self.loop.call_at(job.ends, self._end)
            job.on_start(now, d)
            return
        self.running = None

    def _end(self) -> None:
        job, self._timer = self.running, None
        assert job is not None
        self.running = None
        self.operations += 1
        if not job.done:
            job.done = True
            job.on_end(self.loop.time())
        self._next()

    def cancel(self, job: PrefillJob) -> None:
        """The requester went away: a queued job is skipped, a running one interrupted."""
        if job.done:
            return
        job.done = True
        if job is self.running:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self.running = None
            if self.paused_at is None:
                self._next()

    def kill(self) -> list[PrefillJob]:
        """SIGKILL: every job it held is lost (returned so their requests can fail)."""
        lost = [j for j in ([self.running] if self.running else []) + list(self.queue)]
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self.running, self.alive, self.paused_at = None, None, False, None
        self.queue.clear()
        for j in lost:
            j.done = True
        return [j for j in lost]

    def restart(self) -> None:
        self.alive, self.paused_at = True, None

    def pause(self) -> None:
        if self.paused_at is not None or not self.alive:
            return
        self.paused_at = self.loop.time()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def resume(self) -> None:
        if self.paused_at is None:
            return
        lost = self.loop.time() - self.paused_at
        self.paused_at = None
        job = self.running
        if job is not None and job.ends is not None:
            job.ends += lost
            self._timer = self.loop.call_at(job.ends, self._end)
        elif job is None:
            self._next()


class Slot:
    """One request in (or waiting for) a decode batch."""

    __slots__ = ("_dec", "_fixed", "_start", "done", "first_token", "on_done", "output_tokens")

    def __init__(self, output_tokens: int, on_done: Callable[[float, float], None]) -> None:
        self.output_tokens = output_tokens
        self.on_done = on_done
        """(first token time, last token time) when the request has all its tokens."""
        self.first_token: float | None = None
        self.done = False
        self._dec: SimDecode | None = None
        """The decode whose batch holds it (None before it joins and after it leaves)."""
        self._start = 0
        """The batch's step count when it joined: it has generated `steps - _start` since."""
        self._fixed = 0
        """Tokens it had generated when it left the batch."""

    @property
    def generated(self) -> int:
        """Tokens generated up to the batch's last change (`SimDecode.t0`)."""
        dec = self._dec
        return self._fixed if dec is None else dec.steps - self._start

    def _leave(self) -> None:
        dec = self._dec
        if dec is not None:
            self._fixed, self._dec = dec.steps - self._start, None


class SimDecode:
    """One decode instance: continuous batching, token progress computed between changes.

    Every request in the batch gains one token per step, so the batch keeps one step count
    (`steps`) and each slot the count when it joined: crediting k steps is one addition, not
    one per slot, and the next completion is the top of a heap of (step it finishes at, order
    it joined) rather than a scan of the batch (at 10,000 instances the per-slot loops were a
    tenth of the simulation)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, iid: str, step_time: Callable[[int], float],
        bs_max: int,
    ) -> None:  # fmt: skip
        self.loop = loop
        self.id = iid
        self.step_time = step_time
        self.bs_max = bs_max
        self.active: dict[Slot, None] = {}
        """The batch, in the order its slots joined."""
        self.waiting: deque[Slot] = deque()
        self._ends: list[tuple[int, int, Slot]] = []
        """(step the slot finishes at, order it joined, slot) for the batch; entries of slots
        that left are dropped when they surface."""
        self._fresh: list[Slot] = []
        """Slots that joined since the last step was credited: their first token is that step."""
        self._joined = 0
        self.t0 = 0.0
        """Time of the batch's last change, a step boundary."""
        self.tau = 0.0
        """Step time of the current batch."""
        self.alive = True
        self.paused_at: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.steps = 0
        self.operations = 0

    # ------------------------------------------------------------------ requests

    def admit(self, slot: Slot) -> None:
        """The request's KV is complete: it joins at the next step boundary."""
        self.waiting.append(slot)
        if self.paused_at is not None:
            return
        now = self.loop.time()
        if not self.active:
            self.t0 = now
            self._change(now)
        elif len(self.active) < self.bs_max:
            k = math.ceil((now - self.t0) / self.tau - 1e-9)
            self._set_timer(self.t0 + k * self.tau)

    def cancel(self, slot: Slot) -> None:
        if slot.done:
            return
        slot.done = True
        if slot in self.waiting:
            self.waiting.remove(slot)
        elif slot in self.active and self.paused_at is None:
            now = self.loop.time()
            self.sync(now)
            del self.active[slot]
            slot._leave()
            self._change(self.t0)

    # ------------------------------------------------------------------ the batch

    def _left(self) -> int:
        """Steps until the batch's next completion (the batch is not empty)."""
        ends, active = self._ends, self.active
        while ends[0][2] not in active:
            heapq.heappop(ends)
        return ends[0][0] - self.steps

    def sync(self, now: float) -> None:
        """Credit the steps completed since t0 (the batch was constant meanwhile)."""
        if not self.active or self.tau <= 0:
            self.t0 = max(self.t0, now) if not self.active else self.t0
            return
        k = math.floor((now - self.t0) / self.tau + 1e-9)
        if k <= 0:
            return
        k = min(k, self._left())
        if self._fresh:  # their first token ends the first step credited to them
            first = self.t0 + self.tau
            for s in self._fresh:
                if s._dec is self:
                    s.first_token = first
            if k > 0:
                self._fresh.clear()
        self.steps += k
        self.t0 += k * self.tau

    def _change(self, at: float) -> None:
        """At a step boundary: finish what is done, admit what waits, re-time the batch."""
        ends, active, steps = self._ends, self.active, self.steps
        while ends and ends[0][0] <= steps:
            s = heapq.heappop(ends)[2]
            if s not in active:
                continue
            del active[s]
            s._leave()
            s.done = True
            self.operations += 1
            first = s.first_token if s.first_token is not None else at
            s.on_done(first, at)
        waiting = self.waiting
        while waiting and len(active) < self.bs_max:
            s = waiting.popleft()
            s._dec, s._start = self, steps
            self._joined += 1
            heapq.heappush(ends, (steps + s.output_tokens, self._joined, s))
            active[s] = None
            self._fresh.append(s)
        if not active:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            return
        self.tau = self.step_time(len(active))
        self._set_timer(self.t0 + self._left() * self.tau, replace=True)

    def _set_timer(self, when: float, replace: bool = False) -> None:
        if self._timer is not None:
            if not replace and self._timer.when() <= when:
                return
            self._timer.cancel()
        self._timer = self.loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._timer = None
        now = self.loop.time()
        self.sync(now)
        self._change(self.t0)

    # ------------------------------------------------------------------ faults

    def kill(self) -> list[Slot]:
        if self.paused_at is None:
            self.sync(self.loop.time())  # tokens made before it died were streamed
        lost = [s for s in [*self.active, *self.waiting] if not s.done]
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        for s in self.active:
            s._leave()
        self.active.clear()
        self._ends.clear()
        self._fresh.clear()
        self.waiting.clear()
        self.alive, self.paused_at = False, None
        for s in lost:
            s.done = True
        return lost

    def restart(self) -> None:
        self.alive, self.paused_at = True, None

    def pause(self) -> None:
        if self.paused_at is not None or not self.alive:
            return
        now = self.loop.time()
        self.sync(now)
        self.paused_at = now
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def resume(self) -> None:
        if self.paused_at is None:
            return
        now = self.loop.time()
        self.t0 += now - self.paused_at  # the step in progress finishes later by the pause
        self.paused_at = None
        if self.active:
            self._change(self.t0)
        elif self.waiting:
            self.t0 = now
            self._change(now)
