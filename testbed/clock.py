"""The one clock of a run, and the only place that converts by the scales.

Every component of a run reads and waits on real-world time (the time of the system being
emulated) through a `Clock`; none of them multiplies or divides by `time_scale` itself. Live, the
clock follows this machine's monotonic clock, `time_scale` times faster: one wall second is
`time_scale` real-world seconds. On a virtual-time substrate another implementation of the same
protocol advances time by events, and the same components run unchanged.

`Scale` holds the two scales of a run (`time_scale` k, `byte_scale` s) and converts rates and
sizes between the real world and the emulation: emulated link bandwidth = real x k / s, emulated
KV bytes = real / s. Durations go through the clock.

CLOCK_MONOTONIC is system-wide on Linux, so every process of a run (and every container, which
shares the kernel) that builds a `LiveClock` from the same epoch agrees on `now()`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Clock", "LiveClock", "Scale", "until_due"]


class Clock(Protocol):
    """Real-world time of a run: read it, wait on it, and say what it is in wall time."""

    @property
    def time_scale(self) -> float:
        """Real-world seconds per wall second (reported, never computed with elsewhere)."""
        ...

    def now(self) -> float:
        """Real-world seconds since the run's epoch."""
        ...

    def at(self, mono: float) -> float:
        """The real-world time of an instant of this machine's monotonic clock."""
        ...

    def wall(self, real_s: float) -> float:
        """A real-world duration in wall seconds (for socket timeouts and wall deadlines)."""
        ...

    def real(self, wall_s: float) -> float:
        """A wall duration in real-world seconds (how late a step ran, say)."""
        ...

    def wall_until(self, real_t: float) -> float:
        """Wall seconds from now until a real-world instant (<= 0 once it has passed)."""
        ...

    async def sleep(self, real_s: float) -> None:
        """Wait a real-world duration."""
        ...

    async def sleep_until(self, real_t: float) -> None:
        """Wait until a real-world instant (at once if it has passed)."""
        ...


class LiveClock:
    """The clock of a live run: this machine's monotonic clock, `time_scale` times faster.

    `epoch` is the monotonic instant that is real-world time 0.
    """

    __slots__ = ("_k", "epoch")

    def __init__(self, epoch: float | None = None, time_scale: float = 1.0) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale!r}")
        self.epoch = time.monotonic() if epoch is None else epoch
        self._k = float(time_scale)

    @classmethod
    def of(cls, spec: _HasClock) -> LiveClock:
        """The clock a service spec (or anything with `t0` and `time_scale`) describes."""
        return cls(spec.t0, spec.time_scale)

    @classmethod
    def paced(cls, scale: _HasScale, epoch: float | None = None) -> LiveClock:
        """A clock at a scenario's `scale:` (or a `Scale`), from `epoch` (default: now)."""
        return cls(epoch, scale.time_scale)

    @property
    def time_scale(self) -> float:
        return self._k

    def now(self) -> float:
        return (time.monotonic() - self.epoch) * self._k

    def at(self, mono: float) -> float:
        return (mono - self.epoch) * self._k

    def wall(self, real_s: float) -> float:
        return real_s / self._k

    def real(self, wall_s: float) -> float:
        return wall_s * self._k

    def mono(self, real_t: float) -> float:
        """The monotonic instant of a real-world time (for wall deadlines)."""
        return self.epoch + real_t / self._k

    def wall_until(self, real_t: float) -> float:
        return self.mono(real_t) - time.monotonic()

    def reading(self, t: float, on: LiveClock) -> float:
        """This clock's time for real-world time `t` read on clock `on` (another epoch, say
        the services' while this is the load's): the one conversion between two run clocks."""
        return self.at(on.mono(t))

    def rebased(self, epoch: float | None = None) -> LiveClock:
        """The same pace from a new epoch (default: now)."""
        return LiveClock(epoch, self._k)

    async def sleep(self, real_s: float) -> None:
        await asyncio.sleep(max(0.0, real_s / self._k))

    async def sleep_until(self, real_t: float) -> None:
        delay = self.mono(real_t) - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


class _HasClock(Protocol):
    @property
    def t0(self) -> float: ...

    @property
    def time_scale(self) -> float: ...


class _HasScale(Protocol):
    @property
    def time_scale(self) -> float: ...

    @property
    def byte_scale(self) -> float: ...


@dataclass(frozen=True)
class Scale:
    """The run's two scales and the rate and size conversions they imply."""

    time_scale: float = 1.0
    byte_scale: float = 1.0

    @classmethod
    def of(cls, cfg: _HasScale) -> Scale:
        """The scales of a scenario's `scale:` section or of a service spec."""
        return cls(cfg.time_scale, cfg.byte_scale)

    def to_json(self) -> dict[str, float]:
        """As summaries report it: `{"time": k, "bytes": s}`."""
        return {"time": self.time_scale, "bytes": self.byte_scale}

    def wire_rate(self, real_bytes_per_s: float) -> float:
        """Emulated bytes per wall second for a real-world rate: real x k / s."""
        return real_bytes_per_s * self.time_scale / self.byte_scale

    def real_rate(self, wire_bytes_per_s: float) -> float:
        """Real-world bytes per second for an emulated rate: wire x s / k."""
        return wire_bytes_per_s * self.byte_scale / self.time_scale

    def wire_bytes(self, real_bytes: float) -> float:
        """Emulated bytes for real-world bytes: real / s."""
        return real_bytes / self.byte_scale

    def real_bytes(self, wire_bytes: float) -> float:
        return wire_bytes * self.byte_scale


async def until_due(clock: Clock, real_t: float, stop: asyncio.Event) -> bool:
    """Wait (wall-clock) until the real-world instant `real_t`; False if `stop` was set first
    or by then, so a load generator does not submit a request the run no longer wants."""
    delay = clock.wall_until(real_t)
    if delay > 0:
        try:
            await asyncio.wait_for(stop.wait(), delay)
            return False
        except TimeoutError:
            pass
    return not stop.is_set()
