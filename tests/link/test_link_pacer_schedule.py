"""Unit tests: the virtual-clock token bucket and bandwidth schedules (no sockets, no sleeps)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed.link.pacer import BURST_SECONDS, Pacer, piece_size
from testbed.link.schedule import (
    Schedule,
    ScheduleError,
    load_schedule_file,
    parse_rate_kbps,
    parse_steps,
)


def test_back_to_back_reservations_are_exactly_rate() -> None:
    p = Pacer(1000.0, now=0.0)
    t = 0.0
    for _ in range(1000):
        t = p.reserve(10, now=0.0)
    assert t == pytest.approx(10.0)  # 10_000 bytes at 1000 B/s


@given(
    rate=st.floats(min_value=1e3, max_value=1e10),
    sizes=st.lists(st.integers(min_value=1, max_value=1 << 18), min_size=1, max_size=200),
    lateness=st.floats(min_value=0.0, max_value=BURST_SECONDS * 0.99),
)
def test_late_wakeups_do_not_lose_rate(rate: float, sizes: list[int], lateness: float) -> None:
    """A sender that always wakes up a little late still gets the full rate."""
    p = Pacer(rate, now=0.0)
    now = 0.0
    for n in sizes:
        done = p.reserve(n, now)
        if done > now:  # sleeps until `done`, wakes up `lateness` late
            now = done + lateness
    assert p.reserve(0, 0.0) == pytest.approx(sum(sizes) / rate, rel=1e-9)


def test_idle_credit_is_capped_by_burst() -> None:
    p = Pacer(1000.0, now=0.0)
    # After 100 s idle only BURST_SECONDS of credit is left.
    done = p.reserve(1000, now=100.0)
    assert done == pytest.approx(100.0 - BURST_SECONDS + 1.0)


def test_set_rate_retimes_backlog() -> None:
    p = Pacer(1000.0, now=0.0)
    p.reserve(1000, now=0.0)  # busy until t=1
    p.set_rate(500.0, now=0.5)  # 500 bytes left -> 1 s at the new rate
    assert p.backlog_seconds(0.5) == pytest.approx(1.0)
    assert p.reserve(500, now=0.5) == pytest.approx(2.5)


def test_rate_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Pacer(0.0, now=0.0)
    p = Pacer(1.0, now=0.0)
    with pytest.raises(ValueError):
        p.set_rate(-1.0, now=0.0)


def test_piece_size_scales_with_rate() -> None:
    assert piece_size(125_000) < piece_size(125_000_000)
    assert piece_size(1.0) >= 256


def test_parse_rates_and_steps() -> None:
    assert parse_rate_kbps(12500, "r") == 12_500_000
    assert parse_rate_kbps("100Mbps", "r") == pytest.approx(12.5e6)
    assert parse_steps([[1, "10Mbps"], {"at": "0ms", "rate": 100}]) == [
        (0.0, 100_000.0),
        (1.0, 1.25e6),
    ]
    for bad in (0, -5, "fast", True, None):
        with pytest.raises(ScheduleError):
            parse_rate_kbps(bad, "r")
    for bad_steps in ("x", [[1]], [{"at": 1}], [[-1, 10]]):
        with pytest.raises(ScheduleError):
            parse_steps(bad_steps)


def test_schedule_steps_and_period() -> None:
    s = Schedule([(0.0, 100.0), (1.0, 10.0), (2.0, 50.0)], initial=1.0, period=3.0)
    assert [s.rate_at(t) for t in (0.0, 0.5, 1.0, 1.99, 2.5, 3.0, 4.2)] == [
        100.0,
        100.0,
        10.0,
        10.0,
        50.0,
        100.0,
        10.0,
    ]
    assert s.next_change(0.0) == 1.0
    assert s.next_change(2.5) == 3.0
    once = Schedule([(1.0, 10.0)], initial=5.0)
    assert once.rate_at(0.5) == 5.0 and once.rate_at(9.0) == 10.0
    assert once.next_change(1.0) is None
    with pytest.raises(ScheduleError):
        Schedule([(0.0, 1.0), (5.0, 2.0)], initial=1.0, period=4.0)


def test_schedule_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    f = tmp_path / "trace.csv"
    f.write_text("time,rate\n# a comment\n0, 100Mbps\n1.5s 1250\n3,100Mbps\n")
    assert load_schedule_file(str(f)) == [(0.0, 12.5e6), (1.5, 1.25e6), (3.0, 12.5e6)]
    (tmp_path / "bad").write_text("0 100\n1 2 3\n")
    with pytest.raises(ScheduleError, match="line 2"):
        load_schedule_file(str(tmp_path / "bad"))
    with pytest.raises(ScheduleError):
        load_schedule_file(str(tmp_path / "missing"))
