"""bench/sim_speed.py's instruction counts (`--instructions`): the whole command's from
callgrind's last line, the simulation's from the dump the child asks for as it ends, shown
beside the CPU seconds only when counted."""

from __future__ import annotations

from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"

CALLGRIND_TAIL = """==4242== Events    : Ir
==4242== Collected : 6165039086
==4242==
==4242== I   refs:      6,165,039,086
"""


def _row(cpu: float, instructions: float | None = None) -> dict[str, float]:
    row = {"simulate_cpu_s": cpu, "command_cpu_s": cpu + 1, "requests": 3993.0}
    if instructions is not None:
        row["instructions"] = instructions
        row["simulate_instructions"] = instructions / 2
    return row


def _dump(reason: str, total: int) -> str:
    return f"version: 1\ncreator: callgrind-3.19.0\ndesc: Trigger: {reason}\n\ntotals: {total}\n"


def test_the_count_is_callgrinds_collected_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import sim_speed

    assert sim_speed.COLLECTED.findall(CALLGRIND_TAIL) == ["6165039086"]
    assert sim_speed.COLLECTED.findall("==1== I   refs: 6,165\n") == []


def test_the_simulations_count_is_the_dumps_made_as_one_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import sim_speed

    dumps = [
        _dump("dump before-simulation", 2_000),
        _dump("dump simulated", 700),
        _dump("Program termination", 90),
    ]
    assert sim_speed.simulated_instructions(dumps) == 700
    assert sim_speed.simulated_instructions([*dumps, _dump("dump simulated", 300)]) == 1000
    assert sim_speed.simulated_instructions(dumps[::2]) == 0


def test_the_table_has_an_instructions_column_only_when_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import sim_speed

    timed = sim_speed.runs_table({("abc", "prfaas-static"): [_row(0.7), _row(0.9)]})
    assert "instructions" not in timed
    counted = sim_speed.runs_table(
        {("abc", "prfaas-static"): [_row(0.7, 6.2e9), _row(0.9, 6.1e9)]}
    ).splitlines()
    assert counted[0].endswith(
        "| simulate, G instructions | command, G instructions "
        "| simulate instructions / prfaas-static |"
    )
    assert counted[1].count("|") == counted[0].count("|") == counted[2].count("|")
    assert counted[2].endswith("| 3.075 [3.050-3.100] | 6.150 [6.100-6.200] | 1.00x [1.00-1.00] |")
