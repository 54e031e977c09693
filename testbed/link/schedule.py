"""Bandwidth schedules: piecewise-constant rate steps that play out over time.

A cross-datacenter link's capacity moves (the paper's "link bandwidth fluctuates"); a schedule
replays such a trace. It is a sorted list of steps `(at, rate)`: from `at` seconds after the
schedule starts, the rate is `rate` bytes/s until the next step. With a `period` > 0 it repeats.

Steps come from the toxic's `schedule` attribute or from a samples file. In both, a time is a
number of seconds or a duration string ("500ms"), and a rate is a number in KB/s (Toxiproxy's
bandwidth unit, 1 KB = 1000 bytes) or a bandwidth string ("100Mbps", "12.5MB/s").
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from testbed.units import UnitError, parse_bandwidth, parse_duration

__all__ = ["Schedule", "ScheduleError", "load_schedule_file", "parse_rate_kbps", "parse_steps"]

# Longest file we read; a schedule is a trace, not a data set.
MAX_STEPS = 100_000


class ScheduleError(ValueError):
    """A schedule that cannot be read; the message says which step or line."""


def parse_rate_kbps(value: object, what: str) -> float:
    """A rate in bytes/s from a KB/s number or a bandwidth string; must be > 0."""
    if isinstance(value, bool):
        raise ScheduleError(f"{what}: expected a rate, got {value!r}")
    if isinstance(value, int | float):
        rate = float(value) * 1000.0
    elif isinstance(value, str):
        try:
            rate = parse_bandwidth(value) if not _is_number(value) else float(value) * 1000.0
        except UnitError as exc:
            raise ScheduleError(f"{what}: {exc}") from None
    else:
        raise ScheduleError(f"{what}: expected a rate, got {type(value).__name__}")
    if not math.isfinite(rate) or rate <= 0:
        raise ScheduleError(f"{what}: rate must be positive, got {value!r}")
    return rate


def _parse_time(value: object, what: str) -> float:
    if isinstance(value, bool):
        raise ScheduleError(f"{what}: expected a time, got {value!r}")
    try:
        t = float(value) if isinstance(value, int | float) else parse_duration(value)
    except UnitError as exc:
        raise ScheduleError(f"{what}: {exc}") from None
    if not math.isfinite(t) or t < 0:
        raise ScheduleError(f"{what}: time must be >= 0, got {value!r}")
    return t


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _looks_like_time(text: str) -> bool:
    try:
        parse_duration(text)
    except UnitError:
        return False
    return True


def parse_steps(raw: object) -> list[tuple[float, float]]:
    """Steps from JSON: `[[t, rate], ...]` or `[{"at": t, "rate": r}, ...]`, sorted by time."""
    if not isinstance(raw, list):
        raise ScheduleError("schedule must be a list of [time, rate] steps")
    if len(raw) > MAX_STEPS:
        raise ScheduleError(f"schedule has more than {MAX_STEPS} steps")
    steps: list[tuple[float, float]] = []
    for i, item in enumerate(raw):
        what = f"schedule step {i + 1}"
        if isinstance(item, dict):
            if "at" not in item or "rate" not in item:
                raise ScheduleError(f"{what}: needs keys 'at' and 'rate'")
            t_raw, r_raw = item["at"], item["rate"]
        elif isinstance(item, list | tuple) and len(item) == 2:
            t_raw, r_raw = item
        else:
            raise ScheduleError(f"{what}: expected [time, rate] or {{'at':..., 'rate':...}}")
        steps.append((_parse_time(t_raw, what), parse_rate_kbps(r_raw, what)))
    steps.sort(key=lambda s: s[0])
    return steps


def load_schedule_file(path: str) -> list[tuple[float, float]]:
    """Samples file: one `time rate` per line (comma or whitespace), '#' starts a comment."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ScheduleError(f"schedule_file {path!r}: {exc.strerror or exc}") from None
    steps: list[tuple[float, float]] = []
    header_seen = False
    for lineno, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.replace(",", " ").split()
        what = f"{path}:{lineno}"
        if not steps and not header_seen and not _looks_like_time(fields[0]):
            header_seen = True
            continue  # a CSV header such as "time,rate"
        if len(fields) != 2:
            raise ScheduleError(f"{what}: expected 'time rate', got {line!r}")
        steps.append((_parse_time(fields[0], what), parse_rate_kbps(fields[1], what)))
        if len(steps) > MAX_STEPS:
            raise ScheduleError(f"{what}: more than {MAX_STEPS} samples")
    if not steps:
        raise ScheduleError(f"schedule_file {path!r} has no samples")
    steps.sort(key=lambda s: s[0])
    return steps


@dataclass(frozen=True)
class Schedule:
    """Rate as a function of time since start; `initial` applies before the first step."""

    steps: Sequence[tuple[float, float]]
    initial: float
    period: float = 0.0

    def __post_init__(self) -> None:
        if self.period and self.steps and self.period <= self.steps[-1][0]:
            raise ScheduleError(
                f"period {self.period}s must be longer than the last step ({self.steps[-1][0]}s)"
            )

    def _local(self, elapsed: float) -> tuple[float, float]:
        """(time within the current cycle, start time of the current cycle)."""
        if self.period > 0 and elapsed >= self.period:
            cycles = math.floor(elapsed / self.period)
            return elapsed - cycles * self.period, cycles * self.period
        return elapsed, 0.0

    def rate_at(self, elapsed: float) -> float:
        local, _ = self._local(elapsed)
        i = bisect.bisect_right([s[0] for s in self.steps], local) - 1
        if i < 0:
            # Before the first step: in a repeating schedule the last step carries over.
            if self.period > 0 and elapsed >= self.period and self.steps:
                return self.steps[-1][1]
            return self.initial
        return self.steps[i][1]

    def next_change(self, elapsed: float) -> float | None:
        """Elapsed time of the next step strictly after `elapsed`, or None if none is left."""
        if not self.steps:
            return None
        local, base = self._local(elapsed)
        for at, _ in self.steps:
            if at > local + 1e-9:
                return base + at
        if self.period > 0:
            return base + self.period + self.steps[0][0]
        return None
