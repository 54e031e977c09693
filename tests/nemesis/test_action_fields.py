"""Every field of every nemesis action reaches what the fault does: each fault is started and
ended against the live link (`LinkSetup`, its emulator client faked to record the API calls)
and fake processes, and what it did carries the entry's values, converted to the emulator's wall
units by the run's scale: the same toxics, named the same, as before faults spoke link verbs.
No run."""

from __future__ import annotations

from typing import Any

import pytest

from testbed.clock import LiveClock
from testbed.config import FixedLengths, ScaleConfig, WorkloadConfig
from testbed.link.deployment import LINK_TOXIC, LinkSetup
from testbed.nemesis import ACTIONS, PlannedFault
from testbed.nemesis.event import BaseLoad, NemesisEvent

TIME_SCALE = 10.0


class Client:
    """The link emulator's API as LinkSetup calls it, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.enabled: dict[str, bool] = {}

    async def add_toxic(self, proxy: str, type: str, /, **kw: Any) -> None:
        self.calls.append(
            ("add", proxy, type, kw["stream"], kw["attributes"], kw["toxicity"], kw["name"])
        )

    async def update_toxic(self, proxy: str, name: str, /, **kw: Any) -> None:
        self.calls.append(("update", proxy, name, kw["attributes"]))

    async def remove_toxic(self, proxy: str, name: str, /) -> None:
        self.calls.append(("remove", proxy, name))

    async def enable(self, name: str, /) -> None:
        self.enabled[name] = True
        self.calls.append(("enable", name))

    async def disable(self, name: str, /) -> None:
        self.enabled[name] = False
        self.calls.append(("disable", name))

    async def proxies(self) -> dict[str, Any]:
        return {name: {"enabled": on} for name, on in self.enabled.items()}


class Kernel:
    """A kernel shaper (`shaper: tc`), recorded into the client's calls to keep their order."""

    name = "fake"

    def __init__(self, calls: list[tuple[Any, ...]]) -> None:
        self.calls = calls

    async def set_rate(self, rate: float, /) -> None:
        self.calls.append(("rate", rate))

    async def cut(self) -> None:
        self.calls.append(("blackhole", True))

    async def mend(self) -> None:
        self.calls.append(("blackhole", False))

    async def counters(self) -> dict[str, Any] | None:
        return None


def live_link(kernel: bool = False) -> tuple[LinkSetup, Client]:
    client = Client()
    link = LinkSetup(
        {}, ScaleConfig(time_scale=TIME_SCALE), 100e9 / 8, client=client,  # type: ignore[arg-type]
        proxies=["xdc-a", "xdc-b"], kernel=Kernel(client.calls) if kernel else None,
    )  # fmt: skip
    return link, client


class Processes:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def kill(self, handle: Any, /) -> None:
        self.calls.append(("kill", handle))

    async def pause(self, handle: Any, /) -> None:
        self.calls.append(("pause", handle))

    async def resume(self, handle: Any, /) -> None:
        self.calls.append(("resume", handle))

    async def restart(self, handle: Any, /) -> Any:
        self.calls.append(("restart", handle))
        return handle


class Ctx:
    def __init__(self, kernel: bool = False) -> None:
        self.substrate = Processes()
        self.services = {i: i for i in ("local-decode-0", "local-decode-1")}
        self.link, self.client = live_link(kernel)
        self.clock = LiveClock(time_scale=TIME_SCALE)


async def play(
    entry: dict[str, Any], targets: tuple[str, ...] = ("link",), *, kernel: bool = False
) -> Ctx:
    """Start the entry's fault, then end it, against a fresh context."""
    config = ACTIONS[entry["action"]].config
    fault = ACTIONS[entry["action"]](PlannedFault(0, config.model_validate(entry), targets))
    ctx = Ctx(kernel)
    await fault.start(ctx)
    await fault.end(ctx)
    return ctx


def toxics(ctx: Ctx) -> list[tuple[Any, ...]]:
    """(type, stream, attributes, toxicity) of each toxic added to the first proxy."""
    return [c[2:6] for c in ctx.client.calls if c[0] == "add" and c[1] == "xdc-a"]


async def test_bandwidth_sets_the_cap_and_restores_it() -> None:
    ctx = await play({"action": "bandwidth", "at": "1s", "bandwidth": "8Gbps"})
    rates = [c[3]["rate"] for c in ctx.client.calls if c[:3] == ("update", "xdc-a", LINK_TOXIC)]
    assert rates == pytest.approx([1e9 * TIME_SCALE / 1000, 100e9 / 8 * TIME_SCALE / 1000])
    assert ctx.link.configured_bytes_per_s == 100e9 / 8
    tc = await play({"action": "bandwidth", "at": "1s", "bandwidth": "8Gbps"}, kernel=True)
    assert [c[0] for c in tc.client.calls] == ["rate", "rate"]  # the kernel caps, not a toxic


async def test_latency_rtt_and_jitter_in_wall_milliseconds() -> None:
    ctx = await play({"action": "latency", "at": "1s", "rtt": "200ms", "jitter": "50ms"})
    attrs = {"latency": 100.0 / TIME_SCALE, "jitter": 50.0 / TIME_SCALE}
    assert toxics(ctx) == [
        ("latency", "upstream", attrs, 1.0),
        ("latency", "downstream", attrs, 1.0),
    ]
    only_rtt = await play({"action": "latency", "at": "1s", "rtt": "100ms"})
    assert toxics(only_rtt)[0][2] == {"latency": 50.0 / TIME_SCALE, "jitter": 0.0}


async def test_partition_mode_and_timeout() -> None:
    cut = await play({"action": "partition", "at": "1s"})
    assert cut.client.calls == [
        ("disable", "xdc-a"), ("disable", "xdc-b"), ("enable", "xdc-a"), ("enable", "xdc-b"),
    ]  # fmt: skip
    hole = await play({"action": "partition", "at": "1s", "mode": "timeout", "timeout": "2s"})
    assert toxics(hole) == [
        ("timeout", s, {"timeout": 2000 / TIME_SCALE}, 1.0) for s in ("upstream", "downstream")
    ]
    assert not any(c[0] in ("disable", "blackhole") for c in hole.client.calls)
    tc = await play(
        {"action": "partition", "at": "1s", "mode": "timeout", "timeout": "2s"}, kernel=True
    )
    calls = tc.client.calls  # the kernel drops first and passes again last
    assert calls[0] == ("blackhole", True) and calls[-1] == ("blackhole", False)
    assert toxics(tc) == toxics(hole)
    assert not any(c[0] == "disable" for c in tc.client.calls)


async def test_toxics_are_named_after_the_fault_and_removed_at_its_end() -> None:
    ctx = await play({"action": "latency", "at": "1s", "rtt": "200ms"})
    added = [(c[1], c[6]) for c in ctx.client.calls if c[0] == "add"]
    assert added == [
        ("xdc-a", "nemesis-0-latency-0"), ("xdc-a", "nemesis-0-latency-1"),
        ("xdc-b", "nemesis-0-latency-0"), ("xdc-b", "nemesis-0-latency-1"),
    ]  # fmt: skip
    assert [c[1:] for c in ctx.client.calls if c[0] == "remove"] == added


async def test_reset_peer_timeout_and_toxicity() -> None:
    ctx = await play({"action": "reset_peer", "at": "1s", "timeout": "3s", "toxicity": 0.25})
    assert toxics(ctx) == [("reset_peer", "upstream", {"timeout": 3000 / TIME_SCALE}, 0.25)]


async def test_slow_close_delay_and_toxicity() -> None:
    ctx = await play({"action": "slow_close", "at": "1s", "delay": "5s", "toxicity": 0.5})
    assert toxics(ctx)[0] == ("slow_close", "upstream", {"delay": 5000 / TIME_SCALE}, 0.5)


@pytest.mark.parametrize(
    ("entry", "calls"),
    [
        ({"action": "kill", "at": "1s", "target": "local-decode"}, ["kill", "restart"]),
        ({"action": "pause", "at": "1s", "for": "2s", "target": "local-decode"},
         ["pause", "resume"]),
        ({"action": "restart", "at": "1s", "target": "local-decode"}, ["restart"]),
    ],
)  # fmt: skip
async def test_process_faults_act_on_their_planned_targets(
    entry: dict[str, Any], calls: list[str]
) -> None:
    ctx = await play(entry, targets=("local-decode-1",))
    assert ctx.substrate.calls == [(c, "local-decode-1") for c in calls]


def extra(entry: dict[str, Any]) -> list[float]:
    ev: NemesisEvent = ACTIONS["burst"].config.model_validate(entry)
    wl = WorkloadConfig(lengths=FixedLengths(tokens=100), output_tokens=4)
    reqs = ev.extra_requests(0, BaseLoad(seed=1, rate_rps=2.0, duration_s=1000.0, workload=wl))
    assert reqs is not None
    return [r.arrival for r in reqs]


def test_burst_at_for_and_multiplier() -> None:
    base = extra({"action": "burst", "at": "100s", "for": "50s", "multiplier": 2})
    assert 60 < len(base) < 140 and min(base) >= 100 and max(base) < 150  # (2 - 1) x 2 req/s x 50 s
    later = extra({"action": "burst", "at": "300s", "for": "50s", "multiplier": 2})
    assert min(later) >= 300
    longer = extra({"action": "burst", "at": "100s", "for": "200s", "multiplier": 2})
    assert max(longer) > 150
    more = extra({"action": "burst", "at": "100s", "for": "50s", "multiplier": 5})
    assert len(more) > 2.5 * len(base)  # (5 - 1) x 2 req/s against (2 - 1) x 2 req/s
