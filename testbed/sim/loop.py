"""Virtual time for the `sim` substrate: an asyncio event loop whose clock is a number that jumps
to the next timer whenever nothing is ready, and the `Clock` that reads it.

Why an event loop and not a bare event heap: the scheduler's control loops, the nemesis player
and their controllers are ordinary asyncio code (`clock.sleep`, `asyncio.gather`,
`asyncio.timeout`, `asyncio.to_thread`). On this loop they run unchanged, in virtual time, so
the simulator shares them instead of copying them. Two things differ from a live loop:

- `time()` is virtual: it only moves when the loop has nothing ready, and then straight to the
  earliest timer (no waiting), so an hour of traffic takes as long as its events take to run;
- `run_in_executor` (hence `asyncio.to_thread`) runs the function at once, on the loop's own
  thread: a planner call then costs no virtual time and its result cannot depend on how fast a
  thread happened to be, which keeps a run deterministic.

The loop does no I/O: its selector only accepts the registration of the loop's own self-pipe.
A run that waits on something with no timer behind it can never continue; the loop says so
(`SimulationStalled`) instead of hanging.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import gc
import heapq
import itertools
import selectors
from collections.abc import Callable, Coroutine, Iterator, Mapping
from typing import Any, TypeVar

__all__ = ["SimulationStalled", "VirtualClock", "VirtualLoop", "run_virtual"]

T = TypeVar("T")


class SimulationStalled(RuntimeError):
    """Nothing is ready and no timer is set: the simulated run can never make progress."""


class _VirtualSelector(selectors.BaseSelector):
    """Accepts registrations (the loop's self-pipe) and never reports an fd ready. The loop
    never waits on it: when nothing is ready it moves its own virtual time
    (`VirtualLoop.advance_to_next_timer`)."""

    def __init__(self) -> None:
        self._map: dict[int, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._map[fd] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._map.pop(fd)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._map

    def close(self) -> None:
        self._map.clear()


_Entry = tuple[float, int, asyncio.TimerHandle]
"""A timer in the loop's heap: (when, order set, handle). Timers due at the same instant run
first in, first out, as a reader of the models expects (heapq alone would not keep that
order), and the heap compares tuples in C: with a Python `__lt__` on the handle, the ~16
comparisons per push and pop at 10,000 instances were a twentieth of the 10K-GPU hour."""

_PURGE_MIN = 100
_PURGE_SHARE = 0.5
"""As BaseEventLoop: rebuild the heap without cancelled timers when it holds more than 100
and over half are cancelled (asyncio.base_events' _MIN_SCHEDULED_TIMER_HANDLES and
_MIN_CANCELLED_TIMER_HANDLES_FRACTION)."""


class _Timer(asyncio.TimerHandle):
    """A TimerHandle made in one call: the sim makes six or seven per request, and
    TimerHandle's constructor chain (with its debug-mode check) was a twentieth of the
    simulation. Without debug mode's creation traceback: the virtual loop has no debug mode."""

    __slots__ = ()

    def __init__(
        self,
        when: float,
        callback: Callable[..., object],
        args: tuple[Any, ...],
        loop: asyncio.AbstractEventLoop,
        context: contextvars.Context | None,
    ) -> None:
        self._context = context if context is not None else contextvars.copy_context()
        self._loop = loop
        self._callback = callback
        self._args = args
        self._cancelled = False
        self._repr = None
        self._source_traceback = None
        self._when = when
        self._scheduled = True


class VirtualLoop(asyncio.SelectorEventLoop):
    """An asyncio loop in virtual time (see the module docstring); time starts at 0."""

    def __init__(self) -> None:
        selector = _VirtualSelector()
        self._vt = 0.0
        self._seq = itertools.count()
        super().__init__(selector)
        self._clock_resolution = 1e-6
        """Timers within a virtual microsecond run together (the loop pops every timer due
        before now + resolution, and the resolution must exceed the float spacing at any
        virtual time a run reaches)."""

    def time(self) -> float:
        return self._vt

    def call_at(  # type: ignore[override]
        self, when: float, callback: Callable[..., object], *args: Any, context: Any = None
    ) -> asyncio.TimerHandle:
        """BaseEventLoop.call_at with FIFO order among timers due at the same time."""
        if self._closed:  # type: ignore[attr-defined]
            raise RuntimeError("Event loop is closed")
        timer = _Timer(when, callback, args, self, context)
        heapq.heappush(self._scheduled, (when, next(self._seq), timer))
        return timer

    def advance_to_next_timer(self) -> None:
        """Nothing is ready: jump to the earliest timer (the loop pops cancelled ones off the
        head first), or stop the run if there is none (nothing else can ever wake it)."""
        scheduled: list[_Entry] = self._scheduled
        if not scheduled:
            raise SimulationStalled("nothing is ready and no timer is set")
        when = scheduled[0][0]
        if when > self._vt:
            self._vt = when

    def _run_once(self) -> None:
        """BaseEventLoop._run_once (CPython 3.11-3.13) over the heap of `_Entry` tuples: drop
        cancelled timers, move virtual time to the next one when nothing is ready (instead of
        waiting on the selector: no fd is ever ready), make the timers now due ready, run what
        was ready. Without its debug mode's slow-callback warning: a callback takes no virtual
        time."""
        scheduled: list[_Entry] = self._scheduled  # type: ignore[has-type]
        n = len(scheduled)
        cancelled = self._timer_cancelled_count  # type: ignore[has-type]
        if n > _PURGE_MIN and cancelled / n > _PURGE_SHARE:
            live = []
            for entry in scheduled:
                if entry[2]._cancelled:
                    entry[2]._scheduled = False  # type: ignore[attr-defined]
                else:
                    live.append(entry)
            heapq.heapify(live)
            self._scheduled = scheduled = live
            self._timer_cancelled_count = 0
        else:
            while scheduled and scheduled[0][2]._cancelled:
                self._timer_cancelled_count -= 1
                heapq.heappop(scheduled)[2]._scheduled = False  # type: ignore[attr-defined]
        ready: collections.deque[asyncio.Handle] = self._ready  # type: ignore[attr-defined]
        if not ready and not self._stopping:  # type: ignore[attr-defined]
            self.advance_to_next_timer()
        end_time = self._vt + self._clock_resolution
        pop = heapq.heappop
        while scheduled and scheduled[0][0] < end_time:
            timer = pop(scheduled)[2]
            timer._scheduled = False  # type: ignore[attr-defined]
            ready.append(timer)
        popleft = ready.popleft
        for _ in range(len(ready)):
            handle = popleft()
            if not handle._cancelled:
                handle._run()

    def run_in_executor(  # type: ignore[override]
        self, executor: Any, func: Callable[..., T], *args: Any
    ) -> asyncio.Future[T]:
        """Run `func` now, on this thread: no virtual time passes and nothing races."""
        fut: asyncio.Future[T] = self.create_future()
        try:
            fut.set_result(func(*args))
        except BaseException as exc:
            fut.set_exception(exc)
        return fut


class VirtualClock:
    """The `testbed.clock.Clock` of a simulated run: real-world seconds are the loop's virtual
    seconds, and there is no wall time to convert to (time_scale 1: a duration "in wall time"
    is the same virtual duration, which is what faults and timeouts on the sim need)."""

    __slots__ = ("_loop",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    @property
    def time_scale(self) -> float:
        return 1.0

    def now(self) -> float:
        return self._loop.time()

    def at(self, mono: float) -> float:
        return mono

    def wall(self, real_s: float) -> float:
        return real_s

    def real(self, wall_s: float) -> float:
        return wall_s

    def wall_until(self, real_t: float) -> float:
        return real_t - self._loop.time()

    async def sleep(self, real_s: float) -> None:
        await asyncio.sleep(max(0.0, real_s))

    async def sleep_until(self, real_t: float) -> None:
        delay = real_t - self._loop.time()
        if delay > 0:
            await asyncio.sleep(delay)


YOUNG_THRESHOLDS = (100_000, 10, 100)
"""The collector's thresholds while a simulation runs (Python's default: 700, 10, 10)."""


@contextlib.contextmanager
def young_collections() -> Iterator[None]:
    """Collect garbage cycles young during a simulation, and rarely scan what it keeps.

    A simulation allocates millions of short-lived objects (futures, timer handles, the
    coroutines' cycles) while the records and history it keeps only grow. With the default
    thresholds every few hundred thousand allocations the collector scanned that whole growing
    heap: a fifth of the CPU of ten copies of the Mooncake trace, and the reason the sim grew
    faster than its trace. Here the objects made before the run are frozen (never scanned),
    young collections are rarer, and a full one waits for 100 older ones; a cycle still dies
    in the young generations (the simulation makes few: the young collections of ten copies of
    the Mooncake trace under prfaas-static freed no object). A young collection every
    10,000 net allocations still cost ten copies under prfaas-static 0.23 CPU s of 5.3 (18
    young and one middle collection over the records and queued requests it keeps); every
    100,000, 0.07 in one (timed with gc.callbacks; bench/reports/sim_speed.md has the pairs).
    Restored on the way out."""
    before = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(*YOUNG_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


def run_virtual(main: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion on a fresh virtual-time loop, then cancel what is left.

    Not asyncio.Runner: its Ctrl-C plumbing formats the main task (with its result, every
    record of the run) when it checks the SIGINT handler, which costs more than a small run."""
    with young_collections():
        return _run_virtual(main)


def _run_virtual(main: Coroutine[Any, Any, T]) -> T:
    loop = VirtualLoop()
    try:
        task = loop.create_task(main)
        return loop.run_until_complete(task)
    finally:
        left = asyncio.all_tasks(loop)
        for t in left:
            t.cancel()
        if left:
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
