"""Bandwidth schedules: piecewise-constant rate steps that play out over time.

A cross-datacenter link's capacity moves (the paper's "link bandwidth fluctuates"); a schedule
replays such a trace. It is a sorted list of steps `(at, rate)`: from `at` seconds after the
schedule starts, the rate is `rate` bytes/s until the next step. With a `period` > 0 it repeats.

Steps come from the toxic's `schedule` attribute or from a samples file. In both, a time is a
number of seconds or a duration string ("500ms"), and a rate is a number in KB/s (Toxiproxy's
bandwidth unit, 1 KB = 1000 bytes) or a bandwidth string ("100Mbps", "12.5MB/s").
"""

from __future__ import annotations

import asyncio
import bisect
import math
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass

from testbed.link.errors import show
from testbed.units import UnitError, parse_bandwidth, parse_duration

__all__ = [
    "FILE_TIMEOUT",
    "MAX_FILE_BYTES",
    "MIN_STEP_SECONDS",
    "Schedule",
    "ScheduleError",
    "load_schedule_file",
    "parse_rate_kbps",
    "parse_steps",
    "read_schedule_file",
]

# Longest schedule we take; a schedule is a trace, not a data set.
MAX_STEPS = 100_000
# Largest samples file we read (100,000 "time rate" lines with comments fit easily).
MAX_FILE_BYTES = 8 << 20
# Seconds a samples file may take to read before the call fails (a hung network filesystem).
FILE_TIMEOUT = 5.0
# Closest two steps may be, and shortest period: each step is a timer on the event loop, and a
# step much shorter than the pacer's 4 ms pieces cannot show in the delivered rate anyway.
MIN_STEP_SECONDS = 0.001
# Longest time or rate string ("1.5s", "100Mbps"); anything longer is not a quantity.
MAX_TEXT = 64


class ScheduleError(ValueError):
    """A schedule that cannot be read; the message says which step or line."""


def _float(value: int | float, what: str, kind: str) -> float:
    try:
        return float(value)
    except OverflowError:  # an int too large for a float
        raise ScheduleError(f"{what}: {kind} is out of range") from None


def _text(value: str, what: str, kind: str) -> str:
    if len(value) > MAX_TEXT:
        raise ScheduleError(f"{what}: {kind} {show(value)} is too long for a {kind}")
    return value


def parse_rate_kbps(value: object, what: str) -> float:
    """A rate in bytes/s from a KB/s number or a bandwidth string; must be > 0."""
    if isinstance(value, bool):
        raise ScheduleError(f"{what}: expected a rate, got {value!r}")
    if isinstance(value, int | float):
        rate = _float(value, what, "rate") * 1000.0
    elif isinstance(value, str):
        text = _text(value, what, "rate")
        try:
            rate = parse_bandwidth(text) if not _is_number(text) else float(text) * 1000.0
        except UnitError as exc:
            raise ScheduleError(f"{what}: {exc}") from None
    else:
        raise ScheduleError(f"{what}: expected a rate, got {type(value).__name__}")
    if not math.isfinite(rate) or rate <= 0:
        raise ScheduleError(f"{what}: rate must be positive and finite, got {show(value)}")
    return rate


def _parse_time(value: object, what: str) -> float:
    if isinstance(value, bool):
        raise ScheduleError(f"{what}: expected a time, got {value!r}")
    if isinstance(value, int | float):
        t = _float(value, what, "time")
    elif isinstance(value, str):
        try:
            t = parse_duration(_text(value, what, "time"))
        except UnitError as exc:
            raise ScheduleError(f"{what}: {exc}") from None
    else:
        raise ScheduleError(f"{what}: expected a time, got {type(value).__name__}")
    if not math.isfinite(t) or t < 0:
        raise ScheduleError(f"{what}: time must be >= 0 and finite, got {show(value)}")
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


def parse_schedule_text(text: str, path: str) -> list[tuple[float, float]]:
    """Samples: one `time rate` per line (comma or whitespace), '#' starts a comment.

    Errors name the file and the line and say what was expected, but never quote the line:
    the path is the caller's, the content may be anything on the server (say, /etc/passwd).
    """
    where = f"schedule_file {path!r}"
    steps: list[tuple[float, float]] = []
    header_seen = False
    for lineno, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.replace(",", " ").split()
        at = f"{where} line {lineno}"
        if not steps and not header_seen and not _looks_like_time(fields[0]):
            header_seen = True
            continue  # a CSV header such as "time,rate"
        if len(fields) != 2:
            raise ScheduleError(f"{at}: expected 2 fields 'time rate', found {len(fields)}")
        try:
            t = _parse_time(fields[0], at)
        except ScheduleError:
            raise ScheduleError(
                f"{at}: the time is not a number of seconds >= 0 or a duration such as 500ms"
            ) from None
        try:
            rate = parse_rate_kbps(fields[1], at)
        except ScheduleError:
            raise ScheduleError(
                f"{at}: the rate is not a KB/s number > 0 or a bandwidth such as 100Mbps"
            ) from None
        steps.append((t, rate))
        if len(steps) > MAX_STEPS:
            raise ScheduleError(f"{at}: more than {MAX_STEPS} samples")
    if not steps:
        raise ScheduleError(f"{where} has no samples")
    steps.sort(key=lambda s: s[0])
    return steps


def _read_bounded(path: str, limit: int) -> bytes:
    """The bytes of regular file `path`, at most `limit` of them (blocking: run it in a thread).

    Opened non-blocking so a FIFO without a writer cannot hang the open; anything but a regular
    file (FIFO, device such as /dev/zero, directory, socket) is refused before reading.
    """
    where = f"schedule_file {path!r}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise ScheduleError(f"{where}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ScheduleError(f"{where}: not a regular file")
        if st.st_size > limit:
            raise ScheduleError(f"{where}: larger than {limit} bytes")
        chunks: list[bytes] = []
        size = 0
        while size <= limit:  # the size may lie (procfs) or grow: count what is read
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise ScheduleError(f"{where}: larger than {limit} bytes")
        return b"".join(chunks)
    except OSError as exc:
        raise ScheduleError(f"{where}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def load_schedule_file(path: str) -> list[tuple[float, float]]:
    """Steps from a samples file (blocking, bounded in size; the API uses read_schedule_file)."""
    data = _read_bounded(path, MAX_FILE_BYTES)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ScheduleError(f"schedule_file {path!r}: not UTF-8 text") from None
    return parse_schedule_text(text, path)


async def read_schedule_file(path: str) -> list[tuple[float, float]]:
    """load_schedule_file in a thread, within FILE_TIMEOUT: the event loop never waits on it."""
    try:
        return await asyncio.wait_for(asyncio.to_thread(load_schedule_file, path), FILE_TIMEOUT)
    except TimeoutError:
        raise ScheduleError(
            f"schedule_file {path!r}: reading it timed out after {FILE_TIMEOUT:g} s"
        ) from None


@dataclass(frozen=True)
class Schedule:
    """Rate as a function of time since start; `initial` applies before the first step."""

    steps: Sequence[tuple[float, float]]
    initial: float
    period: float = 0.0

    def __post_init__(self) -> None:
        steps, period = self.steps, self.period
        if period and steps and period <= steps[-1][0]:
            raise ScheduleError(
                f"period {period:g} s must be longer than the last step ({steps[-1][0]:g} s)"
            )
        # Each step is a timer: steps closer than MIN_STEP_SECONDS (2e-9 s, say) would keep
        # the event loop busy firing them. Equal times are one step (the later one wins).
        if period and period < MIN_STEP_SECONDS:
            raise ScheduleError(
                f"period {period:g} s is shorter than the minimum step spacing, "
                f"{MIN_STEP_SECONDS:g} s"
            )
        for i in range(1, len(steps)):
            gap = steps[i][0] - steps[i - 1][0]
            if 0 < gap < MIN_STEP_SECONDS:
                raise ScheduleError(
                    f"schedule steps {i} and {i + 1} (in time order) are {gap:.3g} s apart; "
                    f"steps must be at least {MIN_STEP_SECONDS:g} s apart"
                )
        if period and steps:
            wrap = period - steps[-1][0] + steps[0][0]
            if wrap < MIN_STEP_SECONDS:
                raise ScheduleError(
                    f"period {period:g} s repeats the first step {wrap:.3g} s after the last "
                    f"one; steps must be at least {MIN_STEP_SECONDS:g} s apart"
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
