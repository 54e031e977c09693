"""bench/per_copy.py (`bench/sim_speed.py --per-copy`): where a tiled trace's copies end, the
sim's virtual loop marked as it reaches each end without running different events, and each
copy's seconds and instructions read back in order."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from testbed.sim.loop import VirtualLoop, run_virtual

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def per_copy(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(BENCH))
    # mark_copies patches the loop class: put the original back after the test
    monkeypatch.setattr(VirtualLoop, "advance_to_next_timer", VirtualLoop.advance_to_next_timer)
    import per_copy

    return per_copy


def _dump(reason: str, total: int) -> str:
    return f"version: 1\ndesc: Trigger: dump {reason}\n\nsummary: {total}\ntotals: {total}\n"


def test_a_copy_ends_where_the_next_one_arrives(per_copy: Any) -> None:
    arrivals = [22.5, 0.0, 2.5, 10.0, 12.5, 20.0]  # three copies of (0, 2.5), period 10
    assert per_copy.boundaries(arrivals, 3) == [10.0, 20.0, 30.0]
    with pytest.raises(ValueError, match="not 4 equal copies"):
        per_copy.boundaries(arrivals, 4)
    with pytest.raises(ValueError, match="at least 2"):
        per_copy.boundaries(arrivals, 1)


def test_the_loop_is_marked_as_virtual_time_reaches_each_end(per_copy: Any) -> None:
    woke: list[float] = []
    marked: list[tuple[int, float]] = []

    async def sleeper() -> None:
        loop = asyncio.get_running_loop()
        for delay in (4.0, 4.0, 4.0, 0.5, 10.0):  # wakes at 4, 8, 12, 12.5, 22.5
            await asyncio.sleep(delay)
            woke.append(loop.time())

    run_virtual(sleeper())
    unmarked = list(woke)
    woke.clear()
    # each mark notes the last wake-up before it
    per_copy.mark_copies([5.0, 6.0, 10.0, 20.0], lambda k: marked.append((k, woke[-1])))
    run_virtual(sleeper())
    assert woke == unmarked  # no timer added: the same wake-ups at the same times
    # each copy's end is marked once, in order, when time first jumps past it: before the
    # wake-up at 8 runs (ends 5 and 6, both in that jump), before the one at 12 (end 10),
    # before 22.5 (end 20)
    assert marked == [(1, 4.0), (2, 4.0), (3, 8.0), (4, 12.5)]


def test_each_copys_seconds_are_the_gaps_between_marks(per_copy: Any) -> None:
    assert per_copy.copy_seconds(1.0, [2.0, 4.0], 7.0) == [1.0, 2.0, 3.0]


def test_each_copys_instructions_are_its_dump_and_the_drain_is_the_last(per_copy: Any) -> None:
    dumps = [
        _dump("before-simulation", 9_000),
        _dump("copy-1", 300),
        _dump("copy-2", 320),
        _dump("simulated", 40),
        _dump("Program termination", 700),
    ]
    assert per_copy.copy_instructions(dumps, "simulated") == [300.0, 320.0, 40.0]


def test_the_simulations_count_adds_the_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import sim_speed

    dumps = [_dump("before-simulation", 9_000), _dump("copy-1", 300), _dump("copy-2", 320)]
    assert sim_speed.simulated_instructions([*dumps, _dump("simulated", 40)]) == 660


def test_the_table_gives_the_first_copy_the_others_the_drain_and_the_spread(
    per_copy: Any,
) -> None:
    rows = {
        ("abc", "prfaas"): [
            {"copy_cpu_s": [0.5, 0.6, 0.8, 0.1], "copy_instructions": [3e9, 3.1e9, 3.3e9, 2e8]},
            {"copy_cpu_s": [0.7, 0.6, 0.6, 0.1], "copy_instructions": [3e9, 3.1e9, 3.3e9, 2e8]},
        ],
        ("abc", "no copies"): [{"simulate_cpu_s": 1.0}],
    }
    lines = per_copy.copy_table(rows).splitlines()
    assert len(lines) == 3  # the header, its rule, one row: the run without copies is left out
    assert lines[0].count("|") == lines[1].count("|") == lines[2].count("|")
    # medians per copy: 0.6, 0.6, 0.7 s and 3.0, 3.1, 3.3 G
    assert lines[2] == (
        "| abc | prfaas | 3 | 0.60 | 0.60-0.70 | 0.10 | 1.17x | 3.000 | 3.100-3.300 | 0.200 "
        "| 1.10x |"
    )


def test_sim_speed_measures_each_copy_of_a_run(tmp_path: Path) -> None:
    """End to end, on two copies of the small trace: the child splits its run where the second
    copy arrives, and the report gets a row of two copies and a drain."""
    argv = [
        *("--scenario", str(BENCH.parent / "scenarios/mooncake-trace.yaml")),
        *("--trace", str(BENCH.parent / "scenarios/traces/mooncake-small.jsonl")),
        *("--duration", "150", "--times", "2", "--per-copy", "--policy", "prfaas"),
        *("--set", "workload.arrivals.load=null", "--repeat", "1", "--cpu", "-1"),
        *("--no-timeline", "--report", str(tmp_path / "report.md")),
    ]
    done = subprocess.run(
        [sys.executable, str(BENCH / "sim_speed.py"), *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in (tmp_path / "report.md").read_text().splitlines() if "| 2 |" in line]
    assert len(rows) == 1 and "| prfaas | 2 |" in rows[0], rows
    cells = rows[0].split("|")
    copy_1, (low, high), drain = float(cells[4]), cells[5].split("-"), float(cells[6])
    assert copy_1 > 0 and float(low) == float(high) > 0 and drain >= 0  # one other copy


def test_a_run_without_each_copys_count_shows_dashes(per_copy: Any) -> None:
    rows = {
        ("abc", "prfaas"): [
            {"copy_cpu_s": [0.5, 0.6, 0.1], "copy_instructions": [3e9, 3.1e9, 2e8]},
            {"copy_cpu_s": [0.7, 0.6, 0.1], "copy_instructions": [3e9, 5e8]},  # a dump missing
        ],
    }
    row = per_copy.copy_table(rows).splitlines()[2]
    assert row == "| abc | prfaas | 2 | 0.60 | 0.60-0.60 | 0.10 | 1.00x | - | - | - | - |"
