"""The run's progress on the terminal, in the units the report uses.

The bar counts real-world seconds of workload (what the scenario's `duration` and the report's
timeline speak), not requests, and shows the real-world request rate; start-up and writing the
results are lines of their own, with the wall time each took, so a slow start is not mistaken
for a slow run.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from testbed.clock import LiveClock
from testbed.scenario.plan import Progress

__all__ = ["ProgressDisplay"]


class ProgressDisplay:
    """Callable handed to `run_scenario`; `close()` when the run returns. With `bar=False` only
    the phase lines are printed (e.g. `--quiet` prints nothing at all: do not create one)."""

    def __init__(self, out: TextIO | None = None, bar: bool = True) -> None:
        self.out = out if out is not None else sys.stderr  # looked up now: tests swap it
        self.use_bar = bar
        self.wall = LiveClock()  # time_scale 1: real-world seconds are wall seconds
        self.phase = ""
        self.phase_started = self.wall.now()
        self.walls: dict[str, float] = {}
        self.bar: Any = None

    def _enter(self, phase: str) -> float:
        """Switch phase; returns the wall seconds the previous one took."""
        now = self.wall.now()
        took = now - self.phase_started
        if self.phase:
            self.walls[self.phase] = self.walls.get(self.phase, 0.0) + took
        self.phase, self.phase_started = phase, now
        return took

    def __call__(self, p: Progress) -> None:
        if p.phase == "starting" and self.phase != "starting":
            self._enter("starting")
            print(f"starting {p.services} services ...", file=self.out, flush=True)
            return
        if p.phase in ("running", "draining") and self.phase == "starting":
            took = self._enter("running")
            print(f"started in {took:.1f}s wall", file=self.out, flush=True)
            if self.use_bar:
                from tqdm import tqdm

                self.bar = tqdm(
                    total=round(p.duration_s),
                    unit="s",
                    desc="workload (real-world s)",
                    file=self.out,
                    bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f}s "
                    "[{elapsed} wall{postfix}]",
                )
        if p.phase == "results":
            self._close_bar()
            self._enter("results")
            print(
                f"arrivals and drain took {self.walls.get('running', 0.0):.1f}s wall; "
                "writing results ...",
                file=self.out,
                flush=True,
            )
            return
        if self.bar is not None:
            rate = p.done / p.workload_s if p.workload_s > 0 else 0.0
            self.bar.n = round(p.workload_s)
            self.bar.set_postfix_str(
                f"{p.done}/{p.planned} req done, {p.submitted - p.done} in flight, "
                f"{rate:.2f} req/s real-world" + (", draining" if p.phase == "draining" else ""),
                refresh=False,
            )
            self.bar.refresh()

    def _close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def close(self) -> None:
        """End of the run: the last phase's wall time is counted, the bar closed."""
        self._close_bar()
        if self.phase:
            self._enter("")
