"""A set of half-open byte ranges, for tracking which parts of a layer have arrived.

Retries resend frames that may already have arrived, possibly cut at different offsets, so the
receiver counts *new* bytes by range arithmetic rather than by trusting frame counts. Frames of a
layer mostly arrive in order, so the list of disjoint ranges stays short (usually one element) and
a bisect per insert is all the work there is.
"""

from __future__ import annotations

import bisect

__all__ = ["RangeSet"]


class RangeSet:
    """Disjoint, sorted, non-adjacent [start, end) ranges over non-negative integers."""

    __slots__ = ("_ends", "_starts", "covered")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self.covered = 0  # total bytes in the set

    def add(self, start: int, end: int) -> int:
        """Insert [start, end); returns how many of those bytes were not already present."""
        if start < 0 or end < start:
            raise ValueError(f"invalid range [{start}, {end})")
        if start == end:
            return 0
        starts, ends = self._starts, self._ends
        # First range that could touch [start, end): the last one starting at or before `start`.
        i = bisect.bisect_right(starts, start) - 1
        if i < 0 or ends[i] < start:
            i += 1
        # Ranges i..j-1 overlap or touch the new one; merge them all.
        j = i
        overlap = 0
        new_start, new_end = start, end
        while j < len(starts) and starts[j] <= end:
            overlap += max(0, min(ends[j], end) - max(starts[j], start))
            new_start = min(new_start, starts[j])
            new_end = max(new_end, ends[j])
            j += 1
        starts[i:j] = [new_start]
        ends[i:j] = [new_end]
        added = (end - start) - overlap
        self.covered += added
        return added

    def contains(self, start: int, end: int) -> bool:
        """True when every byte of [start, end) is in the set."""
        if start >= end:
            return True
        i = bisect.bisect_right(self._starts, start) - 1
        return i >= 0 and self._ends[i] >= end

    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self._starts, self._ends, strict=True))

    def __len__(self) -> int:
        return len(self._starts)

    def __repr__(self) -> str:
        return f"RangeSet({self.ranges()!r})"
