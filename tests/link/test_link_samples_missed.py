"""#33 defect 3: a link sample that fails is counted and shown. The emulator's /metrics answers
500 (or the qdisc cannot be read): the sample is a `link_miss` history event with the reason
(testbed.link.deployment), the summary counts the misses with their reasons next to the link's
bytes, report.md's Link section shows them, and a run that lost most of its samples says so on
the console. Before, a broken /metrics made every later sample vanish: a run reported 0.74 GB
moved instead of 11.7 GB, every checker passed, exit 0, no warning."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from testbed.clock import Scale
from testbed.config import ScaleConfig, SloConfig
from testbed.link.client import LinkClient
from testbed.link.deployment import LINK_MISS, LinkSetup
from testbed.metrics.records import HistoryEvent
from testbed.metrics.report import render_report
from testbed.metrics.summary import link_stats, summarize, to_text

METRICS = 'testbed_link_bytes_total{proxy="xdc-a",direction="upstream"} %d\n'


class Emulator:
    """A stand-in for the emulator's API on 127.0.0.1: /metrics answers from `answers` in
    turn (a byte count, or an HTTP status to fail with), then keeps failing with 500."""

    def __init__(self, answers: list[int]) -> None:
        self.answers = answers

    async def metrics(self, _request: web.Request) -> web.Response:
        a = self.answers.pop(0) if self.answers else -500
        if a < 0:
            return web.json_response({"error": "boom", "status": -a}, status=-a)
        return web.Response(text=METRICS % a, content_type="text/plain")


@contextlib.asynccontextmanager
async def emulator(answers: list[int]) -> AsyncIterator[LinkClient]:
    app = web.Application()
    app.router.add_get("/metrics", Emulator(answers).metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with LinkClient(f"http://127.0.0.1:{port}", timeout=5) as client:
            yield client
    finally:
        await runner.cleanup()


def setup_on(client: LinkClient, kernel: Any = None) -> LinkSetup:
    scale = ScaleConfig(time_scale=1, byte_scale=1000)
    return LinkSetup({}, scale, 12.5e9, client=client, proxies=["xdc-a"], kernel=kernel)


async def test_a_sample_the_emulator_cannot_give_is_a_miss_with_its_reason() -> None:
    async with emulator([1000, -500, 3000, -503]) as client:
        setup = setup_on(client)
        events = [await setup.sample_event(float(t)) for t in range(1, 6)]
    assert [e.kind if e else None for e in events] == ["link", LINK_MISS, "link", LINK_MISS,
                                                       LINK_MISS]  # fmt: skip
    assert events[2] is not None and events[2].data["wire_bytes"] == 3000
    miss = events[1]
    assert miss is not None and miss.t == 2.0
    assert "LinkApiError" in miss.data["reason"] and "500" in miss.data["reason"]
    assert "boom" in miss.data["reason"] and miss.data["shaper"] == "emulator"


async def test_sample_still_says_none_for_a_miss_and_for_no_link() -> None:
    async with emulator([-500]) as client:
        assert await setup_on(client).sample() is None
    assert await LinkSetup({}, ScaleConfig(), 1e9).sample_event(1.0) is None  # no link at all


class Kernel:
    """A tc shaper whose counters fail, then skip a read (None: too soon), then work."""

    name = "tc"

    def __init__(self) -> None:
        self.reads: list[Any] = [OSError("tc: Cannot find device"), None,
                                 {"bytes": 0, "packets": 0, "drops": 0, "overlimits": 0,
                                  "rate": 1.0, "at": 1.0}]  # fmt: skip

    async def counters(self) -> dict[str, Any] | None:
        r = self.reads.pop(0)
        if isinstance(r, Exception):
            raise r
        return r


async def test_the_tc_shaped_path_counts_its_misses_the_same_way() -> None:
    async with emulator([]) as client:
        setup = setup_on(client, kernel=Kernel())
        miss, skipped, read = [await setup.sample_event(float(t)) for t in range(3)]
    assert miss is not None and miss.kind == LINK_MISS and miss.data["shaper"] == "tc"
    assert miss.data["reason"] == "OSError: tc: Cannot find device"
    assert skipped is None  # a skipped read is no miss
    assert read is not None and read.kind == "link"


def history(read: int, missed: int) -> list[HistoryEvent]:
    """`read` samples of 1 GB more each (emulated 1 MB at byte_scale 1000), then `missed`."""
    out = [
        HistoryEvent(float(t + 1), "link", {"wire_bytes": 1e6 * (t + 1), "gbps": 8.0,
                                            "configured_gbps": 100.0})
        for t in range(read)
    ]  # fmt: skip
    reason = "LinkApiError: link API error 500: boom"
    out += [HistoryEvent(float(read + t + 1), LINK_MISS, {"reason": reason}) for t in range(missed)]
    return out


def run_summary(read: int, missed: int) -> dict[str, Any]:
    slo = SloConfig(ttft="4s", decode_tokens_per_s=10)
    return summarize([], history(read, missed), duration_s=20.0, slo=slo, scale=Scale(1, 1000))


@pytest.mark.parametrize(("read", "missed"), [(3, 17), (0, 20)], ids=["most", "all"])
def test_most_samples_missed_are_counted_shown_and_warned(read: int, missed: int) -> None:
    s = run_summary(read, missed)
    link = s["link"]
    assert (link["samples"], link["samples_missed"]) == (read, missed)
    assert link["samples_missed_reasons"] == {"LinkApiError: link API error 500: boom": missed}
    assert link["bytes"] == pytest.approx(read * 1e9)
    text = to_text(s)
    assert f"; {missed} samples missed" in text
    warn = [line for line in text.splitlines() if line.startswith("WARNING: link:")]
    assert warn == [
        f"WARNING: link: {missed} of {read + missed} samples missed (LinkApiError: link API "
        "error 500: boom): the link's bytes and rates undercount what moved"
    ]
    report = render_report("x", s, [], [])
    section = report.split("## Link", 1)[1].split("\n## ", 1)[0]
    assert f"Samples missed: {missed} of {read + missed} ({missed}x LinkApiError" in section
    assert "Most samples were missed" in section
    assert "No link samples (no cross-datacenter link" not in section


def test_a_few_misses_are_shown_without_a_warning() -> None:
    s = run_summary(read=18, missed=2)
    assert s["link"]["samples_missed"] == 2
    text = to_text(s)
    assert "; 2 samples missed" in text and "WARNING" not in text
    section = render_report("x", s, [], []).split("## Link", 1)[1].split("\n## ", 1)[0]
    assert "Samples missed: 2 of 20 (2x LinkApiError" in section
    assert "Most samples" not in section


def test_a_run_without_a_link_misses_nothing() -> None:
    """The sim and a deployment without a second datacenter: no samples, no misses, no line."""
    none = link_stats([], byte_scale=1.0)
    assert (none["samples_missed"], none["samples_missed_reasons"]) == (0, {})
    s = run_summary(read=0, missed=0)
    assert "samples missed" not in to_text(s) and "WARNING" not in to_text(s)
    assert "No link samples (no cross-datacenter link" in render_report("x", s, [], [])
