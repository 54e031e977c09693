"""The cross-datacenter link on the sim: transfers as flows sharing its bandwidth.

Every KV transfer (and prefix pull) across the link is a flow of real-world bytes. The link's
capacity is split max-min fairly among the active flows: a flow that cannot use its share (a
layer-wise transfer caught up with the prefill producing its KV is capped at S_kv / T_prefill)
leaves the rest to the others. Rates change only when a flow starts, catches up with or outlives
its producer, completes, or the link changes (a fault, a heal), so the link sets one timer for
the next of those: events grow with transfers, not with bytes or frames.

The common case at scale is a link with room to spare: every flow has caught up with its prefill
and the producers' rates sum to less than the capacity, so each runs with its producer and ends
when the prefill does. The link then keeps its flows in a fast mode: sent bytes computed from
time when asked (aggregates for the link's total), the flows' ends in a heap, so a start or an
end costs O(log n) instead of re-sharing among all n active flows (hundreds at 10,000
instances). Anything else (a prefix pull with all its bytes there, a congested link, a fault)
drops to the general water-filling below, which returns to fast mode when flows are simple.

A flow's last byte reaches the decode one-way delay later (RTT/2 plus any latency fault plus a
seeded uniform draw in +-jitter), its acknowledgement the sender the same delay after that.

Faults, as the link verbs (testbed.nemesis.verbs, played by testbed.sim.nemesis) act on the
transfers (docs/sim.md):
- partition (`cut("disable")`): active flows fail at once (connections reset), new ones fail at
  start (the receiver is unreachable); timeout (`cut("timeout")`): data is black-holed, flows
  stall and each fails after `timeout` of no progress (never, if 0); the heal lets stalled
  flows continue;
- reset: a flow picked with probability `toxicity` loses its connection `timeout` after
  data starts and resumes after that delay from what was acknowledged; the sender gives up
  after its retries (3 resets) and the transfer fails;
- slow_close: transfers keep their connections open, so nothing changes for them (recorded);
- delay: adds RTT/2 each way and widens the jitter.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Flow", "SimLink"]

SENDER_RETRIES = 2
"""Reconnects a transfer survives (transfer.sender's pooled senders use max_retries=2)."""
_EPS = 1e-9


@dataclass(eq=False)
class Flow:
    """One transfer across the link, in real-world bytes."""

    size: float
    on_done: Callable[[float], None]
    """Called with the time the last byte reaches the receiver."""
    on_fail: Callable[[str], None]
    producer_rate: float = math.inf
    """Bytes/s its producer emits while `producing` (a prefill); inf when all is there."""
    produce_until: float = 0.0
    sent: float = 0.0
    produced0: float = 0.0
    produced_t: float = 0.0
    rate: float = 0.0
    sent_t: float = 0.0
    """In the link's fast mode, `sent` is as of this time and grows at `rate` since."""
    capped: bool = True
    """Caught up with the producer: runs at most at the producer's rate."""
    resets: int = 0
    stalled_since: float | None = None
    blocked_until: float = 0.0
    sender: str = ""
    done: bool = False
    tags: dict[str, Any] = field(default_factory=dict)

    def produced(self, t: float) -> float:
        if self.producer_rate == math.inf or t >= self.produce_until:
            return self.size
        return min(self.size, self.produced0 + self.producer_rate * (t - self.produced_t))


class SimLink:
    """The link's flows, capacity and faults (see the module docstring)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        bandwidth: float,
        rtt: float,
        jitter: float,
        seed: int,
        *,
        fast: bool = True,
    ) -> None:
        self.loop = loop
        self.fast_allowed = fast
        """False keeps every flow in the general water-filling (the fast mode's reference)."""
        self.capacity = bandwidth
        """Real bytes/s in force (a bandwidth fault changes it)."""
        self.rtt = rtt
        self.jitter = jitter
        self.extra_rtt = 0.0
        self.extra_jitter = 0.0
        self.rng = random.Random(seed)
        self.flows: dict[Flow, None] = {}
        """The active flows, in start order (a dict: O(1) removal)."""
        self._by_sender: dict[str, dict[Flow, None]] = {}
        """The active flows of each sender (its acknowledged and in-flight bytes walk only
        those: the short-term loop polls every sender)."""
        self.t = 0.0
        self.delivered = 0.0
        """Real bytes carried so far (cumulative, what the link samples report)."""
        self.acked_by: dict[str, float] = {}
        """Bytes delivered per sender instance (its KV sender's acknowledged counter)."""
        self.partition: str | None = None
        """None, "disable" or "timeout" while a partition lasts."""
        self.partition_timeout = 0.0
        self.reset_toxicity = 0.0
        self.reset_after = 0.0
        self.resetting = False
        self._timer: asyncio.TimerHandle | None = None
        self._fast = fast
        """Every flow runs with its producer (module docstring); the fields below hold then."""
        self._rate_sum = 0.0
        """Sum of the fast flows' rates (bytes/s)."""
        self._anchor_sum = 0.0
        """Sum of rate x sent_t over the fast flows: their unsent-to-date bytes are
        rate_sum x now - anchor_sum."""
        self._ends: list[tuple[float, int, Flow]] = []
        self._seq = itertools.count()

    # ------------------------------------------------------------------ delays

    def one_way(self) -> float:
        """One crossing of the link: RTT/2 plus a jitter draw (seeded)."""
        base = (self.rtt + self.extra_rtt) / 2
        j = self.jitter + self.extra_jitter
        if j > 0:
            base += self.rng.uniform(-j, j)
        return max(base, 0.0)

    # ------------------------------------------------------------------ flows

    def start(self, flow: Flow, duration: float = 0.0) -> None:
        """Start a flow now; its producer emits `size` evenly over `duration` (0: all there)."""
        now = self.loop.time()
        if self._fast:
            if (
                duration > 0
                and self.partition is None
                and not self.resetting
                and self._rate_sum + flow.size / duration <= self.capacity
            ):
                self._start_fast(flow, now, duration)
                return
            self._to_slow(now)
        self._advance(now)
        if self.partition == "disable":
            flow.done = True
            flow.on_fail("kv transfer: receiver unreachable (link partitioned)")
            return
        flow.produced_t = now
        if duration > 0:
            flow.producer_rate = flow.size / duration
            flow.produce_until = now + duration
        if self.resetting and self.rng.random() < self.reset_toxicity:
            flow.tags["reset_at"] = now + self.reset_after
        self._add(flow)
        self._reschedule(now)

    def cancel(self, flow: Flow) -> None:
        if flow.done:
            return
        now = self.loop.time()
        if self._fast:
            if flow in self.flows:
                self._credit(flow, self._fast_sent(flow, now) - flow.sent)
                self._drop_fast(flow)
            flow.done = True  # its entry in the heap of ends is skipped
            return
        self._advance(now)
        flow.done = True
        self._remove(flow)
        self._reschedule(now)

    def in_queue(self, sender: str) -> float:
        """Bytes of `sender`'s active flows produced and not yet delivered (its KV sender's
        in-flight plus queued bytes); never negative: a flow caught up with its producer
        computes both in floats, and their residue (-2.4e-07 was seen) is no queue."""
        if self._fast:
            return self.counters(sender)[1]
        now = self.loop.time()
        self._advance(now)
        return max(sum(f.produced(now) - f.sent for f in self._by_sender.get(sender, ())), 0.0)

    def carried(self) -> float:
        """Real bytes the link has carried so far (what its samples report)."""
        now = self.loop.time()
        if self._fast:
            return self.delivered + max(self._rate_sum * now - self._anchor_sum, 0.0)
        self._advance(now)
        return self.delivered

    def acked(self, sender: str) -> float:
        if self._fast:
            return self.counters(sender)[0]
        self._advance(self.loop.time())
        return self.acked_by.get(sender, 0.0)

    def counters(self, sender: str) -> tuple[float, float]:
        """(`acked`, `in_queue`) of `sender`, in fast mode in one pass over its flows (the
        short-term loop polls all 416 PrfaaS senders a tick at 10K GPUs, a quarter idle)."""
        if not self._fast:
            return self.acked(sender), self.in_queue(sender)
        acked, mine = self.acked_by.get(sender, 0.0), self._by_sender.get(sender)
        if not mine:
            return acked, 0.0
        now = self.loop.time()
        moved = queued = 0.0  # the additions sum() made before Python 3.12 compensated
        for f in mine:
            sent = self._fast_sent(f, now)
            moved += sent - f.sent
            queued += f.produced(now) - sent
        return acked + moved, max(queued, 0.0)

    def _add(self, flow: Flow) -> None:
        self.flows[flow] = None
        self._by_sender.setdefault(flow.sender, {})[flow] = None

    def _remove(self, flow: Flow) -> None:
        self.flows.pop(flow, None)
        mine = self._by_sender.get(flow.sender)
        if mine is not None:
            mine.pop(flow, None)
            if not mine:
                del self._by_sender[flow.sender]

    # ------------------------------------------------------------------ fast mode

    def _fast_sent(self, f: Flow, now: float) -> float:
        return min(f.size, f.sent + f.rate * (now - f.sent_t))

    def _credit(self, f: Flow, moved: float) -> None:
        self.delivered += moved
        self.acked_by[f.sender] = self.acked_by.get(f.sender, 0.0) + moved

    def _start_fast(self, flow: Flow, now: float, duration: float) -> None:
        flow.produced_t = now
        flow.producer_rate = flow.size / duration
        flow.produce_until = now + duration
        flow.rate, flow.sent_t, flow.capped = flow.producer_rate, now, True
        self._add_fast(flow, now)

    def _add_fast(self, flow: Flow, now: float) -> None:
        self._add(flow)
        self._rate_sum += flow.rate
        self._anchor_sum += flow.rate * flow.sent_t
        heapq.heappush(self._ends, (flow.produce_until, next(self._seq), flow))
        if self._ends[0][2] is flow:
            self._arm_fast()

    def _drop_fast(self, flow: Flow) -> None:
        self._remove(flow)
        if self.flows:
            self._rate_sum -= flow.rate
            self._anchor_sum -= flow.rate * flow.sent_t
        else:  # exact zero again: no drift carried from one busy period to the next
            self._rate_sum = self._anchor_sum = 0.0

    def _arm_fast(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._ends and self._ends[0][2].done:
            heapq.heappop(self._ends)
        if self._ends:
            self._timer = self.loop.call_at(self._ends[0][0], self._fast_tick)

    def _fast_tick(self) -> None:
        """The flows whose prefill ended now have sent their last byte."""
        self._timer = None
        now = self.loop.time()
        while self._fast and self._ends and self._ends[0][0] <= now:
            _, _, f = heapq.heappop(self._ends)
            if f.done:
                continue
            self._credit(f, f.size - f.sent)
            self._drop_fast(f)
            f.done = True
            f.on_done(now + self.one_way())
        if self._fast:
            self._arm_fast()

    def _to_slow(self, now: float) -> None:
        """Leave fast mode: every flow's sent bytes made explicit, for the water-filling."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for f in self.flows:
            sent = self._fast_sent(f, now)
            self._credit(f, sent - f.sent)
            f.sent, f.sent_t = sent, now
        self._fast = False
        self._rate_sum = self._anchor_sum = 0.0
        self._ends = []
        self.t = now

    def _try_fast(self, now: float) -> bool:
        """Back to fast mode if every flow runs with its producer and they all fit."""
        if not self.fast_allowed or self.partition is not None or self.resetting:
            return False
        total = 0.0
        for f in self.flows:
            if (
                not f.capped
                or not now < f.produce_until
                or f.blocked_until > now
                or f.stalled_since is not None
                or f.tags.get("reset_at") is not None
                or f.sent < f.produced(now) - _EPS * max(f.size, 1.0)
            ):
                return False
            total += f.producer_rate
        if total > self.capacity:
            return False
        self._fast = True
        flows = list(self.flows)
        self.flows = {}
        self._rate_sum = self._anchor_sum = 0.0
        self._ends = []
        for f in flows:
            f.rate, f.sent_t = f.producer_rate, now
            self._add_fast(f, now)
        self._arm_fast()
        return True

    # ------------------------------------------------------------------ faults

    def set_bandwidth(self, bytes_per_s: float) -> None:
        now = self.loop.time()
        self._leave_fast(now)
        self.capacity = bytes_per_s
        self._reschedule(now)

    def cut(self, mode: str, timeout: float) -> int:
        """A partition starts; returns how many transfers it broke at once."""
        now = self.loop.time()
        self._leave_fast(now)
        self.partition, self.partition_timeout = mode, timeout
        broken = 0
        if mode == "disable":
            for f in list(self.flows):
                self._fail(f, "kv transfer: connection reset (link partitioned)")
                broken += 1
        self._reschedule(now)
        return broken

    def heal(self) -> None:
        now = self.loop.time()
        self._leave_fast(now)
        self.partition = None
        for f in self.flows:
            f.stalled_since = None
        self._reschedule(now)

    def set_resets(self, toxicity: float, after: float, on: bool) -> None:
        now = self.loop.time()
        self._leave_fast(now)
        self.resetting, self.reset_toxicity, self.reset_after = on, toxicity, after
        if on:
            for f in self.flows:
                if self.rng.random() < toxicity:
                    f.tags["reset_at"] = now + after
        else:
            for f in self.flows:
                f.tags.pop("reset_at", None)
        self._reschedule(now)

    # ------------------------------------------------------------------ the fluid model

    def _leave_fast(self, now: float) -> None:
        if self._fast:
            self._to_slow(now)
        else:
            self._advance(now)

    def _fail(self, flow: Flow, reason: str) -> None:
        flow.done = True
        self._remove(flow)
        flow.on_fail(reason)

    def _advance(self, now: float) -> None:
        dt = now - self.t
        if dt > 0:
            for f in self.flows:
                if f.rate > 0:
                    moved = min(f.rate * dt, f.size - f.sent)
                    f.sent += moved
                    self.delivered += moved
                    self.acked_by[f.sender] = self.acked_by.get(f.sender, 0.0) + moved
        self.t = now

    def _active(self, f: Flow, now: float) -> bool:
        return self.partition is None and f.blocked_until <= now

    def _allocate(self, now: float) -> None:
        """Max-min fair shares: flows capped at their producer's rate take that, the rest
        share what is left equally (water-filling)."""
        live = [f for f in self.flows if self._active(f, now)]
        for f in self.flows:
            f.rate = 0.0
        left, n = self.capacity, len(live)
        capped = sorted(
            (f for f in live if f.capped and now < f.produce_until),
            key=lambda f: f.producer_rate,
        )
        free = [f for f in live if not (f.capped and now < f.produce_until)]
        for f in capped:
            share = left / n
            if f.producer_rate <= share:
                f.rate = f.producer_rate
                left -= f.rate
                n -= 1
            else:  # the link is the bottleneck: it falls behind its producer
                f.capped = False
                free.append(f)
        if free:
            share = left / len(free)
            for f in free:
                f.rate = share

    def _reschedule(self, now: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        # flows that finished, fell into a reset or timed out in a black hole
        for f in list(self.flows):
            if f.sent >= f.size - _EPS * max(f.size, 1.0) and f.produced(now) >= f.size:
                f.done = True
                self._remove(f)
                f.on_done(now + self.one_way())
                continue
            reset_at = f.tags.get("reset_at")
            if reset_at is not None and reset_at <= now + _EPS:
                f.resets += 1
                if f.resets > SENDER_RETRIES:
                    self._fail(f, "kv transfer: connection reset by peer (retries exhausted)")
                    continue
                f.blocked_until = now + self.reset_after
                f.tags["reset_at"] = (
                    now + 2 * self.reset_after
                    if self.resetting and self.rng.random() < self.reset_toxicity
                    else None
                )
            if self.partition == "timeout":
                if f.stalled_since is None:
                    f.stalled_since = now
                elif self.partition_timeout > 0 and now - f.stalled_since >= self.partition_timeout:
                    self._fail(f, "kv transfer: connection timed out (link black-holed)")
        if not self.flows:
            self._fast = self.fast_allowed
            self._rate_sum = self._anchor_sum = 0.0
            self._ends = []
            return
        if self._try_fast(now):
            return
        self._allocate(now)
        nxt = math.inf
        for f in self.flows:
            if f.rate > 0:
                produced = f.produced(now)
                if f.capped or f.producer_rate == math.inf or now >= f.produce_until:
                    nxt = min(nxt, now + (f.size - f.sent) / f.rate)
                else:  # behind its producer: catches up, or finishes after it stops
                    gap = produced - f.sent
                    if f.rate > f.producer_rate:
                        nxt = min(nxt, now + gap / (f.rate - f.producer_rate))
                    nxt = min(nxt, now + (f.size - f.sent) / f.rate)
            if now < f.produce_until:
                nxt = min(nxt, f.produce_until)
            if f.blocked_until > now:
                nxt = min(nxt, f.blocked_until)
            reset_at = f.tags.get("reset_at")
            if reset_at is not None:
                nxt = min(nxt, reset_at)
            if f.stalled_since is not None and self.partition_timeout > 0:
                nxt = min(nxt, f.stalled_since + self.partition_timeout)
        if nxt < math.inf:  # never at `now` again: a rounding residue must not spin
            self._timer = self.loop.call_at(max(nxt, now + 1e-6), self._tick)

    def _tick(self) -> None:
        self._timer = None
        now = self.loop.time()
        self._advance(now)
        for f in self.flows:  # a flow that reached what its producer made runs with it again
            if not f.capped and f.sent >= f.produced(now) - _EPS * max(f.size, 1.0):
                f.capped = True
        self._reschedule(now)
