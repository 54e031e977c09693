"""Unit tests of each toxic and of live chain changes, on one ToxicLink with fake transports.

No sockets: the source and sink are in-memory transports, so these run in milliseconds and can
check exact bytes, order and (loosely) timing.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from testbed.link.errors import ApiError
from testbed.link.pipeline import LinkStats, Sink, ToxicLink
from testbed.link.toxics import REGISTRY, SlicerToxic, ToxicWrapper

pytestmark = pytest.mark.timeout(30)


class FakeTransport:
    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.writes: list[tuple[float, bytes]] = []
        self.reading = True
        self.eof = False
        self.closed = False

    def write(self, data: bytes | memoryview) -> None:
        self.writes.append((self.loop.time(), bytes(data)))

    @property
    def data(self) -> bytes:
        return b"".join(d for _, d in self.writes)

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True


class FakeConn:
    def __init__(self) -> None:
        self.closed = 0
        self.resets = 0
        self.done: list[str] = []

    def close(self) -> None:
        self.closed += 1

    def reset(self) -> None:
        self.resets += 1

    def direction_done(self, link: ToxicLink) -> None:
        self.done.append(link.direction)


def wrapper(type_name: str, name: str | None = None, toxicity: float = 1.0, **attrs: Any):  # type: ignore[no-untyped-def]
    toxic = REGISTRY[type_name].from_attributes(attrs)
    toxic.activate(asyncio.get_running_loop(), None)
    return ToxicWrapper(name or type_name, type_name, "downstream", toxicity, toxic)


def make_link(
    seed: str | None = "1/p/1",
) -> tuple[ToxicLink, FakeTransport, FakeTransport, FakeConn]:
    loop = asyncio.get_running_loop()
    src, dst, conn = FakeTransport(), FakeTransport(), FakeConn()
    stats = LinkStats()
    link = ToxicLink(loop, "downstream", conn, src, Sink(dst, stats), stats, seed)  # type: ignore[arg-type]
    return link, src, dst, conn


async def until(pred, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        assert loop.time() < end, "condition not reached in time"
        await asyncio.sleep(0.002)


async def test_fast_path_without_toxics() -> None:
    link, _, dst, conn = make_link()
    link.feed(b"abc")
    assert dst.data == b"abc"  # written synchronously, no task or queue involved
    link.feed_eof()
    assert conn.done == ["downstream"]


async def test_latency_is_pipelined_not_serial() -> None:
    link, _, dst, _ = make_link()
    link.add_toxic(wrapper("latency", latency=100))
    t0 = asyncio.get_running_loop().time()
    for i in range(5):
        link.feed(bytes([i]) * 10)
    await until(lambda: len(dst.data) == 50)
    times = [t - t0 for t, _ in dst.writes]
    assert all(0.095 <= t < 0.2 for t in times), times  # 5 chunks in ~100 ms, not 500 ms
    assert dst.data == b"".join(bytes([i]) * 10 for i in range(5))


async def test_latency_jitter_bounds_and_seed_reproducibility() -> None:
    w = wrapper("latency", latency=50, jitter=20)
    delays = []
    for _ in range(2):
        link, _, _, _ = make_link(seed="7/p/3")
        stage = link.add_toxic(w)
        stage.task.cancel()  # type: ignore[union-attr]
        stage.rng.random()  # the toxicity draw the stage makes first
        delays.append([w.toxic.delay(stage.rng) for _ in range(200)])  # type: ignore[attr-defined]
    assert delays[0] == delays[1]
    assert all(0.030 <= d <= 0.070 for d in delays[0])
    other, _, _, _ = make_link(seed="8/p/3")
    assert other.rng_for(w.name).random() != make_link(seed="7/p/3")[0].rng_for(w.name).random()


async def test_bandwidth_per_connection_rate() -> None:
    link, _, dst, _ = make_link()
    link.add_toxic(wrapper("bandwidth", rate=1000))  # 1 MB/s
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    link.feed(b"x" * 200_000)
    await until(lambda: len(dst.data) == 200_000)
    assert dst.writes[-1][0] - t0 == pytest.approx(0.2, abs=0.03)
    assert len(dst.writes) > 10  # delivered in pieces, not one lump


async def test_limit_data_cuts_and_closes() -> None:
    link, _, dst, conn = make_link()
    link.add_toxic(wrapper("limit_data", bytes=1000))
    for _ in range(3):
        link.feed(b"y" * 400)
    await until(lambda: conn.closed > 0)
    assert dst.data == b"y" * 1000


async def test_slicer_pieces() -> None:
    link, _, dst, _ = make_link()
    link.add_toxic(wrapper("slicer", average_size=100, size_variation=20, delay=0))
    payload = bytes(range(256)) * 40
    link.feed(payload)
    await until(lambda: len(dst.data) == len(payload))
    assert dst.data == payload
    sizes = [len(d) for _, d in dst.writes]
    assert len(sizes) > 50 and max(sizes) <= 120


def test_slicer_cuts_cover_the_chunk() -> None:
    import random

    t = SlicerToxic.from_attributes({"average_size": 10, "size_variation": 3})
    cuts = t.cuts(1000, random.Random(1))  # type: ignore[attr-defined]
    assert cuts[0] == 0 and cuts[-1] == 1000 and cuts == sorted(cuts)
    assert all(0 < b - a <= 13 for a, b in itertools.pairwise(cuts))


async def test_slow_close_delays_eof() -> None:
    link, _, dst, conn = make_link()
    link.add_toxic(wrapper("slow_close", delay=100))
    loop = asyncio.get_running_loop()
    link.feed(b"z")
    link.feed_eof()
    t0 = loop.time()
    await until(lambda: conn.done)
    assert loop.time() - t0 >= 0.09
    assert dst.data == b"z"


async def test_timeout_drops_then_closes() -> None:
    link, _, dst, conn = make_link()
    link.add_toxic(wrapper("timeout", timeout=100))
    link.feed(b"dropped")
    await until(lambda: conn.closed > 0)
    assert dst.data == b""


async def test_timeout_zero_holds_until_removed_then_closes() -> None:
    link, _, dst, conn = make_link()
    w = wrapper("timeout", timeout=0)
    stage = link.add_toxic(w)
    link.feed(b"dropped")
    await asyncio.sleep(0.1)
    assert conn.closed == 0 and dst.data == b""
    stage.remove()
    await until(lambda: conn.closed > 0)  # Toxiproxy's Cleanup closes the held connection


async def test_reset_peer_after_first_data() -> None:
    link, _, _, conn = make_link()
    link.add_toxic(wrapper("reset_peer", timeout=50))
    await asyncio.sleep(0.08)
    assert conn.resets == 0  # nothing arrived yet
    link.feed(b"x")
    await until(lambda: conn.resets > 0)


async def test_toxicity_zero_passes_through() -> None:
    link, _, dst, _ = make_link()
    link.add_toxic(wrapper("timeout", toxicity=0.0, timeout=0))
    link.feed(b"kept")
    await until(lambda: dst.data == b"kept")


async def test_remove_latency_flushes_in_order_and_restores_fast_path() -> None:
    link, _, dst, _ = make_link()
    stage = link.add_toxic(wrapper("latency", latency=10_000))
    for i in range(20):
        link.feed(bytes([i]))
    await asyncio.sleep(0.02)
    assert dst.data == b""
    stage.remove()
    link.feed(bytes([20]))  # arrives while the stage drains: must stay behind the others
    await until(lambda: not link.stages)
    link.feed(bytes([21]))
    assert dst.data == bytes(range(22))


async def test_add_toxic_mid_stream_keeps_order() -> None:
    link, _, dst, _ = make_link()
    link.feed(b"a")
    link.add_toxic(wrapper("latency", latency=30))
    link.feed(b"b")
    link.add_toxic(wrapper("slicer", average_size=1, size_variation=0))
    link.feed(b"cd")
    await until(lambda: len(dst.data) == 4)
    assert dst.data == b"abcd"


async def test_update_applies_to_running_stage() -> None:
    link, _, dst, _ = make_link()
    w = wrapper("latency", latency=10_000)
    stage = link.add_toxic(w)
    link.feed(b"held")
    await asyncio.sleep(0.02)
    new = REGISTRY["latency"].from_attributes({"latency": 0}, base=w.toxic.values)
    w.toxic = new
    stage.update(w, restart=True)
    await until(lambda: dst.data == b"held")  # the held chunk is released on interrupt
    link.feed(b"next")
    await until(lambda: dst.data == b"heldnext")


async def test_backpressure_pauses_source() -> None:
    link, src, dst, _ = make_link()
    link.add_toxic(wrapper("bandwidth", rate=1))  # 1 KB/s: effectively stuck
    for _ in range(40):
        link.feed(b"\0" * 256_000)
    assert src.reading is False
    stage = link.stages[0]
    stage.remove()
    await until(lambda: not link.stages, timeout=10)
    assert src.reading is True
    assert len(dst.data) == 40 * 256_000


@pytest.mark.parametrize(
    ("type_name", "attrs", "match"),
    [
        ("latency", {"latency": "10"}, "must be a number"),
        ("latency", {"latency": -1}, "at least 0"),
        ("latency", {"latncy": 10}, "unknown attribute"),
        ("bandwidth", {"rate": 0}, "greater than 0"),
        ("bandwidth", {"rate": -5}, "greater than 0"),
        ("bandwidth", {}, "greater than 0"),
        ("bandwidth", {"rate": True}, "must be an integer"),
        ("slicer", {"average_size": 10, "size_variation": 10}, "smaller than"),
        ("slicer", {"average_size": 0}, "greater than 0"),
        ("limit_data", {"bytes": None}, "must be an integer"),
        ("link_bandwidth", {"rate": 0}, "needs 'rate' > 0"),
        ("link_bandwidth", {"rate": -1}, "greater than 0"),
        ("link_bandwidth", {"schedule": [[1, 100]]}, "needs 'rate' > 0"),
        ("link_bandwidth", {"rate": 10, "schedule": [[0, 0]]}, "positive"),
        ("link_bandwidth", {"rate": 10, "schedule": "x"}, "must be a list"),
    ],
)
def test_bad_attributes_are_400(type_name: str, attrs: dict[str, Any], match: str) -> None:
    with pytest.raises(ApiError, match=match) as info:
        REGISTRY[type_name].from_attributes(attrs)
    assert info.value.status == 400


def test_integral_floats_are_accepted_for_integers() -> None:
    t = REGISTRY["slicer"].from_attributes({"average_size": 100.0})
    assert t.values["average_size"] == 100 and isinstance(t.values["average_size"], int)


def test_latency_accepts_fractional_milliseconds() -> None:
    # extension: a run at time_scale 10 needs sub-millisecond wall-clock delays
    t = REGISTRY["latency"].from_attributes({"latency": 0.25, "jitter": 0.1})
    assert t.values["latency"] == 0.25 and t.values["jitter"] == 0.1
    assert REGISTRY["latency"].from_attributes({"latency": 100}).values["latency"] == 100
