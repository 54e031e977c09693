"""The timeline's link panel with the kernel shaper: the same throughput, plus the qdisc's
overlimits and drops per sample on a second axis, and a label naming the counters."""

from __future__ import annotations

from pathlib import Path

from testbed.metrics.records import HistoryEvent
from testbed.metrics.timeline import write_timeline


def _link(kernel: bool) -> list[HistoryEvent]:
    out = []
    for i in range(40):
        data = {"wire_bytes": 1e6 * i, "gbps": 5.0 if 10 <= i < 20 else 20.0,
                "configured_gbps": 5.0 if 10 <= i < 20 else 100.0}  # fmt: skip
        if kernel:
            data |= {"qdisc_bytes": int(1.05e6 * i), "qdisc_overlimits": 30 * max(0, i - 10),
                     "qdisc_drops": 5 if i > 30 else 0, "qdisc_rate": 1e6}  # fmt: skip
        out.append(HistoryEvent(float(i), "link", data))
    return out


def test_kernel_counters_show_on_the_link_panel(tmp_path: Path) -> None:
    emulator = write_timeline(tmp_path / "e.png", [], _link(False), title="t").read_bytes()
    kernel = write_timeline(tmp_path / "k.png", [], _link(True), title="t").read_bytes()
    assert kernel[:8] == b"\x89PNG\r\n\x1a\n" and kernel != emulator
