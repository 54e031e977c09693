"""bench/sim_speed.py `--per-copy`: a trace replayed N times (`--times N`), measured copy by copy
inside one run.

Issue #35 asks ten copies of the trace to cost at most 10.5x one. Whole runs of one code spread
by a quarter in CPU seconds on a shared host, and the copies of one run need not do the same
work (each meets the queues, threshold and pools the previous ones left). Split at each copy's
end in virtual time, one run says which: the child marks its process CPU time (and, under
callgrind, asks for a dump) when virtual time first reaches the start of the next copy, and
after the last copy the rest of the run is the drain.
"""

from __future__ import annotations

import itertools
import re
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

COPY = "copy-"
"""The reason the child gives callgrind for the dump that ends copy k (`copy-k`)."""

NOTE = (
    "\nEach copy inside its run (bench/per_copy.py): process CPU seconds (and callgrind's "
    "count) from the simulation's start or one copy's end to the next, split where virtual "
    "time reaches the next copy's first arrival; 'after the last' is the drain; per copy, the "
    "median of the runs.\n"
)


def boundaries(arrivals: Sequence[float], copies: int) -> list[float]:
    """The virtual times at which each of `copies` equal copies ends: the first arrival of the
    next copy, and for the last, one copy's period after the last but one. The arrivals are
    the tiled trace's (bench/sim_speed.tiled_trace: copy k is copy 1 shifted by k-1 periods),
    so this holds whatever rate the scenario replays them at."""
    if copies < 2:
        raise ValueError("per-copy figures need at least 2 copies")
    ordered = sorted(arrivals)
    per, extra = divmod(len(ordered), copies)
    if per == 0 or extra:
        raise ValueError(f"{len(ordered)} arrivals are not {copies} equal copies")
    ends = [ordered[k * per] for k in range(1, copies)]
    period = (ends[-1] - ordered[0]) / (copies - 1)
    return [*ends, ends[-1] + period]


def mark_copies(ends: Sequence[float], mark: Callable[[int], None]) -> None:
    """Call `mark(k)` (k = 1..len(ends)) when the sim's virtual time first reaches `ends[k-1]`,
    before anything due then runs: virtual time moves only when the loop jumps to its next
    timer (`VirtualLoop.advance_to_next_timer`), so the jump is where each copy ends. Adds no
    timer, so the run simulates the same events. For the rest of the process (the bench's
    child runs one simulation)."""
    import testbed.sim.loop as sim_loop

    advance = sim_loop.VirtualLoop.advance_to_next_timer
    done = [0]

    def advance_and_mark(self: Any) -> None:
        advance(self)
        now = self.time()
        while done[0] < len(ends) and now >= ends[done[0]]:
            done[0] += 1
            mark(done[0])

    sim_loop.VirtualLoop.advance_to_next_timer = advance_and_mark  # type: ignore[method-assign]


def copy_seconds(start: float, marks: Sequence[float], end: float) -> list[float]:
    """Process CPU seconds of each copy and, last, of the drain, from the times marked."""
    stamps = [start, *marks, end]
    return [b - a for a, b in itertools.pairwise(stamps)]


def marker(
    counting: bool, dump: Callable[[str], None]
) -> tuple[list[float], Callable[[int], None]]:
    """The list of process CPU times marked and the `mark` that fills it (dumping first under
    callgrind, so a copy's dump holds that copy's instructions)."""
    marks: list[float] = []

    def mark(k: int) -> None:
        if counting:
            dump(f"{COPY}{k}")
        marks.append(time.process_time())

    return marks, mark


_TRIGGER = re.compile(r"^desc: Trigger: dump (\S+)$", re.MULTILINE)
_TOTALS = re.compile(r"^totals: (\d+)$", re.MULTILINE)


def copy_instructions(dumps: Sequence[str], simulated: str) -> list[float]:
    """Each copy's instructions and, last, the drain's: the dumps (in the order callgrind wrote
    them) made as a copy ended (`copy-k`) and as the simulation ended (`simulated`)."""
    out: list[float] = []
    for text in dumps:
        trigger, totals = _TRIGGER.search(text), _TOTALS.search(text)
        if trigger and totals and (trigger[1].startswith(COPY) or trigger[1] == simulated):
            out.append(float(totals[1]))
    return out


def copy_table(rows: dict[tuple[str, str], list[dict[str, Any]]]) -> str:
    """A row per (checkout, policy) that has per-copy figures: the first copy, the others'
    range, the drain, and the largest copy over the smallest; per copy index, the median of
    the runs. CPU seconds, and G instructions where counted."""
    counted = any("copy_instructions" in r for rs in rows.values() for r in rs)
    parts = ["copy 1", "copies 2-N", "after the last", "largest / smallest copy"]
    units = ["CPU s", "G instr."] if counted else ["CPU s"]
    columns = ["code", "policy", "copies", *(f"{u}: {p}" for u in units for p in parts)]

    def cells(runs: list[list[float]], want: int, scale: float, digits: int) -> list[str]:
        if any(len(x) != want for x in runs):
            return ["-"] * len(parts)  # a run without each copy's count and the drain's
        per = [statistics.median(xs) / scale for xs in zip(*runs, strict=True)]
        copies, drain = per[:-1], per[-1]
        rest = copies[1:]
        return [f"{copies[0]:.{digits}f}", f"{min(rest):.{digits}f}-{max(rest):.{digits}f}",
                f"{drain:.{digits}f}", f"{max(copies) / min(copies):.2f}x"]  # fmt: skip

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for (code, policy), rs in rows.items():
        if not all("copy_cpu_s" in r for r in rs):
            continue
        want = len(rs[0]["copy_cpu_s"])  # the copies, then the drain
        row = [code, policy, str(want - 1), *cells([r["copy_cpu_s"] for r in rs], want, 1.0, 2)]
        if counted:
            row += cells([r.get("copy_instructions", []) for r in rs], want, 1e9, 3)
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"
