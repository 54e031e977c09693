"""bench/live_targets.py judges issue #35's link-emulator and KV-transfer targets from the
rounds it ran: a cut only against a checkout from before the issue (not judged without one),
the issue's absolute alternatives on their own, the bandwidth error at its worst point, the
floods by their count."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
RTT = "link emulator, CPU µs per round trip with no toxics cut by >= 30%"
PER_GB = "link emulator, CPU s per GB unshaped cut by >= 30%, or unshaped >= 75% of raw loopback"
BANDWIDTH = "link emulator, bandwidth error <= 1% from 1 Mbit/s to 1 Gbit/s (1 and 8 connections)"
KV = (
    "KV transfer (CRC32C), CPU s per GB on each side cut by >= 30%, or >= 700 MB/s at 4 connections"
)
FLOODS = "KV receiver, each of bench/receiver_flood.py's floods grows RSS < 16 MiB"


@pytest.fixture
def live(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(BENCH))
    import live_targets

    return live_targets


def _link(rtt: float, per_gb: float, of_raw: float) -> list[dict[str, float]]:
    return [{"rtt_us": rtt, "s_per_gb": per_gb, "of_raw": of_raw, "floor_rtt_us": 40.0}] * 3


def _kv(sender: float, receiver: float, mb_s: float) -> list[dict[str, float]]:
    return [{"sender_s_per_gb": sender, "receiver_s_per_gb": receiver, "mb_s": mb_s}] * 3


def _judged(live: Any, *, before: bool = True, **given: Any) -> dict[str, bool | None]:
    fig = live.LiveFigures(
        link={"now": given.get("link", _link(50.0, 0.30, 0.60))},
        kv={"now": given.get("kv", _kv(0.30, 0.30, 650.0))},
        bandwidth=given.get("bandwidth", {(1, 1): 1.0, (1000, 8): 1009.0}),
        floods=given.get("floods", {"floods_over_16MiB": 0}),
    )
    if before:
        fig.link["before"] = given.get("link_before", _link(100.0, 0.60, 0.50))
        fig.kv["before"] = given.get("kv_before", _kv(0.60, 0.60, 400.0))
    return {target: met for target, _, met in live.verdicts(fig)}


def test_every_target_is_met_at_its_bound(live: Any) -> None:
    judged = _judged(live, link_before=_link(50 / 0.7, 0.30 / 0.7, 0.5),
                     kv_before=_kv(0.30 / 0.7, 0.30 / 0.7, 400.0))  # fmt: skip
    assert judged == {RTT: True, PER_GB: True, BANDWIDTH: True, KV: True, FLOODS: True}


def test_a_cut_short_of_30_percent_is_not_met(live: Any) -> None:
    judged = _judged(live, link_before=_link(70.0, 0.42, 0.5), kv_before=_kv(0.42, 0.60, 400.0))
    assert judged[RTT] is False  # 50 against 70: -29%
    assert judged[PER_GB] is False  # -29%, and 60% of raw
    assert judged[KV] is False  # the sender -29%, though the receiver -50%


def test_without_a_before_checkout_only_the_alternatives_are_judged(live: Any) -> None:
    judged = _judged(live, before=False)
    assert judged[RTT] is None
    assert judged[PER_GB] is False and judged[KV] is False
    judged = _judged(live, before=False, link=_link(50.0, 0.30, 0.75), kv=_kv(0.3, 0.3, 700.0))
    assert judged[PER_GB] is True and judged[KV] is True


def test_the_worst_bandwidth_point_and_any_flood_decide(live: Any) -> None:
    judged = _judged(live, bandwidth={(1, 1): 0.989, (1000, 8): 1000.0},
                     floods={"floods_over_16MiB": 1})  # fmt: skip
    assert judged[BANDWIDTH] is False
    assert judged[FLOODS] is False
