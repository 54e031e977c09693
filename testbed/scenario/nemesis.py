"""The nemesis: a scenario's fault timeline, played against a live run (Jepsen's vocabulary).

A scenario lists faults (`nemesis:` in its YAML, `testbed.config.NemesisEvent`), each with a
real-world start `at` and an optional duration `for`. Before anything runs, `plan_faults` turns
them into a fixed timeline: times in real-world seconds and the exact instances each process
fault hits (a group target such as `local-decode` picks `count` instances with a generator
seeded from the scenario seed and the fault's index), so the same seed always gives the same
faults. `NemesisPlayer` then plays that timeline on the run's clock (testbed.clock)
alongside the load, and records a history event of kind "fault" for every phase of every fault:
`{"action", "phase": "start" | "end", "target", "index", "at"}` plus what the action changed
(and `error` if the substrate or the link refused, which never stops the run).

One small class per action behind one interface (`Fault.start` / `Fault.end`), like the link
toxics: adding a fault type is one class and one entry in `FAULTS`.

- bandwidth: set the shared cap of the cross-datacenter link; restore it at the end.
- latency: add `rtt` / 2 of delay (+- `jitter`) on both directions of every link proxy.
- partition: `mode: disable` closes the link proxies (connections reset, new ones refused);
  `mode: timeout` black-holes data instead and closes a connection after `timeout` of quiet.
- reset_peer: every connection through the link is reset `timeout` after data starts flowing
  (TCP RST in the middle of a transfer), for connections picked with probability `toxicity`.
- slow_close: connection closes through the link are held for `delay`.
- kill: SIGKILL the target instances; with `for`, start them again (same id, same ports) at
  the end. pause: SIGSTOP, SIGCONT at the end. restart: kill and start again at once.
- burst: nothing to do live: its extra arrivals are generated at prepare time by
  `burst_requests`; the player only records the window.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np

from testbed.clock import Clock
from testbed.config import NEMESIS_TARGET_GROUPS, NemesisEvent, Scenario
from testbed.errors import ConfigError, UserError
from testbed.link.deployment import LinkSetup
from testbed.metrics.records import HistoryEvent
from testbed.substrate.base import ServiceHandle, Substrate
from testbed.workload.build import length_distribution
from testbed.workload.generate import RequestSpec

__all__ = [
    "FAULTS",
    "Fault",
    "NemesisContext",
    "NemesisPlayer",
    "PlannedFault",
    "burst_requests",
    "check_timeline_fits",
    "instance_ids",
    "plan_faults",
]

_LINK_ACTIONS = frozenset({"bandwidth", "latency", "partition", "reset_peer", "slow_close"})
_MAX_STEPS = 10_000
"""Upper bound on timeline steps a player executes (two per fault)."""


# ---------------------------------------------------------------------------------- planning


def instance_ids(n_prfaas: int, n_prefill: int, n_decode: int) -> list[str]:
    """The worker ids of a deployment, as the runner names them."""
    return (
        [f"prfaas-prefill-{i}" for i in range(n_prfaas)]
        + [f"local-prefill-{i}" for i in range(n_prefill)]
        + [f"local-decode-{i}" for i in range(n_decode)]
    )


@dataclass(frozen=True)
class PlannedFault:
    """One fault of the timeline with its targets resolved; times in real-world seconds."""

    index: int
    event: NemesisEvent
    targets: tuple[str, ...]
    """Instance ids for process faults; ("link",) for link faults; () for bursts."""

    @property
    def action(self) -> str:
        return self.event.action

    @property
    def start(self) -> float:
        return self.event.at

    @property
    def end(self) -> float | None:
        return self.event.end


def _resolve_targets(
    ev: NemesisEvent, index: int, ids: Sequence[str], seed: int, where: str
) -> tuple[str, ...]:
    assert ev.target is not None
    if ev.target not in NEMESIS_TARGET_GROUPS:
        if ev.target not in ids:
            raise ConfigError(
                f"{where}.target: no instance {ev.target!r} in this deployment "
                f"(instances: {', '.join(ids)})"
            )
        return (ev.target,)
    group = [i for i in ids if i.rpartition("-")[0] == ev.target]
    if ev.count > len(group):
        raise ConfigError(
            f"{where}.count: {ev.count} exceeds the {len(group)} {ev.target} instances "
            f"of this deployment"
        )
    rng = np.random.default_rng([seed, index])
    picked = rng.choice(len(group), size=ev.count, replace=False)
    return tuple(group[int(i)] for i in sorted(picked))


def plan_faults(
    scenario: Scenario, ids: Sequence[str], *, link_enabled: bool
) -> list[PlannedFault]:
    """Resolve the scenario's nemesis into a fixed timeline (a pure function of the seed)."""
    out: list[PlannedFault] = []
    for i, ev in enumerate(scenario.nemesis):
        where = f"scenario {scenario.name!r}: nemesis.{i}"
        if ev.action in _LINK_ACTIONS:
            if not link_enabled:
                raise ConfigError(
                    f"{where}: action {ev.action!r} needs a cross-datacenter link, and this "
                    f"deployment has none"
                )
            targets: tuple[str, ...] = ("link",)
        elif ev.action == "burst":
            targets = ()
        else:
            targets = _resolve_targets(ev, i, ids, scenario.seed, where)
        out.append(PlannedFault(i, ev, targets))
    return out


def check_timeline_fits(scenario: Scenario, duration_s: float) -> None:
    """Refuse, before anything starts, a timeline with a fault that starts at or after the end
    of the arrivals: it would never be applied (or apply to an idle deployment) and its
    checkers could only say so afterwards. A fault that starts inside the run and ends past it
    is allowed: it is applied, and it ends during the drain or not at all (a `recover` checker
    over it is then vacuous)."""
    late = [
        f"nemesis.{i} ({ev.action} at {ev.at:g}s)"
        for i, ev in enumerate(scenario.nemesis)
        if ev.at >= duration_s
    ]
    if late:
        raise UserError(
            f"scenario {scenario.name!r}: {', '.join(late)} starts at or after the run's "
            f"duration of {duration_s:g}s, so it would exercise nothing; raise --duration or "
            "move the fault"
        )


def burst_requests(
    scenario: Scenario, requests: list[RequestSpec], rate_rps: float | None, duration_s: float
) -> list[RequestSpec]:
    """The run's requests plus every burst's extra arrivals, sorted by arrival.

    A burst with multiplier m adds a Poisson stream at (m - 1) x the base rate during
    [at, at + for) (cut at the run's duration), lengths from the workload's length distribution
    and its output length; ids are "b<fault index>-<n>". Everything is drawn from generators
    seeded with (seed, fault index), so the same seed gives the same extra requests.
    """
    bursts = [(i, ev) for i, ev in enumerate(scenario.nemesis) if ev.action == "burst"]
    if not bursts:
        return requests
    base = rate_rps
    if base is None:  # trace timing: the trace's mean rate over the run
        base = len(requests) / duration_s if duration_s > 0 else 0.0
    extra: list[RequestSpec] = []
    dist = length_distribution(scenario.workload.lengths)
    n_out = max(1, round(scenario.workload.output_tokens))
    for i, ev in bursts:
        assert ev.multiplier is not None and ev.for_ is not None
        start, end = ev.at, min(ev.at + ev.for_, duration_s)
        rate = base * (ev.multiplier - 1.0)
        if end <= start or rate <= 0:
            continue
        arrivals_ss, lengths_ss = np.random.SeedSequence([scenario.seed, i]).spawn(2)
        rng = np.random.default_rng(arrivals_ss)
        n = int(rng.poisson(rate * (end - start)))
        times = np.sort(rng.uniform(start, end, size=n))
        lengths = dist.sample(np.random.default_rng(lengths_ss), n) if n else np.empty(0)
        extra += [
            RequestSpec(f"b{i}-{j + 1:05d}", float(t), max(1, round(float(ln))), n_out)
            for j, (t, ln) in enumerate(zip(times, lengths, strict=True))
        ]
    return sorted([*requests, *extra], key=lambda r: (r.arrival, r.id))


# ---------------------------------------------------------------------------------- actions


class NemesisContext(Protocol):
    """What a fault may touch: the runner's `_Run` provides all of it."""

    substrate: Substrate
    services: dict[str, ServiceHandle]
    link: LinkSetup | None

    @property
    def clock(self) -> Clock:
        """The run's clock (faults convert real-world durations to the emulator's wall ones)."""
        ...


class Fault(ABC):
    """One fault of the timeline: `start` injects it, `end` undoes it (if it has a duration).

    Both return what they changed, which goes into the "fault" history event.
    """

    action: ClassVar[str]

    def __init__(self, planned: PlannedFault) -> None:
        self.planned = planned
        self.event = planned.event

    @abstractmethod
    async def start(self, ctx: NemesisContext) -> dict[str, Any]: ...

    async def end(self, ctx: NemesisContext) -> dict[str, Any]:
        return {}

    def _wall_ms(self, ctx: NemesisContext, real_s: float) -> float:
        return ctx.clock.wall(real_s) * 1e3


def _link(ctx: NemesisContext) -> LinkSetup:
    if ctx.link is None or ctx.link.client is None:
        raise RuntimeError("this run has no link emulator")
    return ctx.link


class _ToxicFault(Fault):
    """A fault that adds toxics to every link proxy at the start and removes them at the end."""

    def toxics(self, ctx: NemesisContext) -> list[tuple[str, str, dict[str, Any], float]]:
        """(type, stream, attributes, toxicity) of each toxic to add to every proxy."""
        raise NotImplementedError

    def _name(self, n: int) -> str:
        return f"nemesis-{self.planned.index}-{self.action}-{n}"

    async def start(self, ctx: NemesisContext) -> dict[str, Any]:
        link = _link(ctx)
        assert link.client is not None
        specs = self.toxics(ctx)
        for proxy in link.proxies:
            for n, (kind, stream, attrs, toxicity) in enumerate(specs):
                await link.client.add_toxic(
                    proxy,
                    kind,
                    name=self._name(n),
                    stream=stream,
                    attributes=attrs,
                    toxicity=toxicity,
                )
        return {"toxics": [{"type": k, "stream": s, **a} for k, s, a, _ in specs]}

    async def end(self, ctx: NemesisContext) -> dict[str, Any]:
        link = _link(ctx)
        assert link.client is not None
        for proxy in link.proxies:
            for n in range(len(self.toxics(ctx))):
                await link.client.remove_toxic(proxy, self._name(n))
        return {}


class BandwidthFault(Fault):
    action = "bandwidth"

    async def start(self, ctx: NemesisContext) -> dict[str, Any]:
        link = _link(ctx)
        assert self.event.bandwidth is not None
        self.before = link.configured_bytes_per_s
        await link.set_bandwidth(self.event.bandwidth)
        return {"gbps": self.event.bandwidth * 8 / 1e9, "was_gbps": self.before * 8 / 1e9}

    async def end(self, ctx: NemesisContext) -> dict[str, Any]:
        await _link(ctx).set_bandwidth(self.before)
        return {"gbps": self.before * 8 / 1e9}


class LatencyFault(_ToxicFault):
    action = "latency"

    def toxics(self, ctx: NemesisContext) -> list[tuple[str, str, dict[str, Any], float]]:
        attrs = {
            "latency": self._wall_ms(ctx, (self.event.rtt or 0.0) / 2),
            "jitter": self._wall_ms(ctx, self.event.jitter or 0.0),
        }
        return [("latency", s, attrs, 1.0) for s in ("upstream", "downstream")]


class PartitionFault(_ToxicFault):
    action = "partition"

    def toxics(self, ctx: NemesisContext) -> list[tuple[str, str, dict[str, Any], float]]:
        timeout_ms = round(self._wall_ms(ctx, self.event.timeout or 0.0))
        return [("timeout", s, {"timeout": timeout_ms}, 1.0) for s in ("upstream", "downstream")]

    async def start(self, ctx: NemesisContext) -> dict[str, Any]:
        if self.event.mode == "timeout":
            return {"mode": "timeout", **await super().start(ctx)}
        link = _link(ctx)
        assert link.client is not None
        for proxy in link.proxies:
            await link.client.disable(proxy)
        return {"mode": "disable", "proxies": len(link.proxies)}

    async def end(self, ctx: NemesisContext) -> dict[str, Any]:
        if self.event.mode == "timeout":
            return await super().end(ctx)
        link = _link(ctx)
        assert link.client is not None
        for proxy in link.proxies:
            await link.client.enable(proxy)
        return {}


class ResetPeerFault(_ToxicFault):
    action = "reset_peer"

    def toxics(self, ctx: NemesisContext) -> list[tuple[str, str, dict[str, Any], float]]:
        attrs = {"timeout": round(self._wall_ms(ctx, self.event.timeout or 0.0))}
        return [("reset_peer", "upstream", attrs, self.event.toxicity)]


class SlowCloseFault(_ToxicFault):
    action = "slow_close"

    def toxics(self, ctx: NemesisContext) -> list[tuple[str, str, dict[str, Any], float]]:
        attrs = {"delay": round(self._wall_ms(ctx, self.event.delay or 0.0))}
        return [("slow_close", s, attrs, self.event.toxicity) for s in ("upstream", "downstream")]


class _ProcessFault(Fault):
    def handles(self, ctx: NemesisContext) -> list[ServiceHandle]:
        return [ctx.services[t] for t in self.planned.targets]

    async def _restart(self, ctx: NemesisContext) -> None:
        for h in self.handles(ctx):
            new = await ctx.substrate.restart(h)
            ctx.services[new.spec.id] = new


class KillFault(_ProcessFault):
    action = "kill"

    async def start(self, ctx: NemesisContext) -> dict[str, Any]:
        await asyncio.gather(*(ctx.substrate.kill(h) for h in self.handles(ctx)))
        return {"signal": "SIGKILL"}

    async def end(self, ctx: NemesisContext) -> dict[str, Any]:
        await self._restart(ctx)
        return {"restarted": True}


class PauseFault(_ProcessFault):
    action = "pause"

    async def start(self, ctx: NemesisContext) -> dict[str, Any]:
        for h in self.handles(ctx):
            await ctx.substrate.pause(h)
        return {"signal": "SIGSTOP"}

    async def end(self, ctx: NemesisContext) -> dict[str, Any]:
        for h in self.handles(ctx):
            await ctx.substrate.resume(h)
        return {"signal": "SIGCONT"}


class RestartFault(_ProcessFault):
    action = "restart"

    async def start(self, ctx: NemesisContext) -> dict[str, Any]:
        await self._restart(ctx)
        return {"restarted": True}


class BurstFault(Fault):
    action = "burst"

    async def start(self, ctx: NemesisContext) -> dict[str, Any]:
        return {"multiplier": self.event.multiplier}


FAULTS: dict[str, type[Fault]] = {
    cls.action: cls
    for cls in (
        BandwidthFault,
        LatencyFault,
        PartitionFault,
        ResetPeerFault,
        SlowCloseFault,
        KillFault,
        PauseFault,
        RestartFault,
        BurstFault,
    )
}


# ---------------------------------------------------------------------------------- playing


class NemesisPlayer:
    """Plays a planned timeline against a live run and records every phase in `history`.

    `clock` reads 0 at the start of the load (the timeline's origin). Run it as a task
    next to the load and cancel it when the load is done: phases not reached are not played
    (the substrate stops everything anyway, resuming paused processes first).
    """

    def __init__(
        self,
        ctx: NemesisContext,
        faults: Sequence[PlannedFault],
        history: list[HistoryEvent],
        clock: Clock,
    ) -> None:
        self.ctx = ctx
        self.history = history
        self.clock = clock
        self.faults = [FAULTS[pf.action](pf) for pf in faults][: _MAX_STEPS // 2]
        self.locks: dict[str, asyncio.Lock] = {}
        """One per target: steps on the same instance (or the link) never overlap, so a restart
        still in progress is not raced by the next fault on that instance."""

    async def run(self) -> None:
        """Every fault on its own task, so a slow restart never delays another fault."""
        async with asyncio.TaskGroup() as tg:
            for fault in self.faults:
                tg.create_task(self._play(fault))

    async def _play(self, fault: Fault) -> None:
        pf = fault.planned
        await self.clock.sleep_until(pf.start)
        ok = await self._step(fault, "start", pf.start)
        if pf.end is not None and ok:
            await self.clock.sleep_until(pf.end)
            await self._step(fault, "end", pf.end)

    async def _step(self, fault: Fault, phase: str, at: float) -> bool:
        data: dict[str, Any] = {
            "action": fault.action,
            "phase": phase,
            "target": ",".join(fault.planned.targets) or None,
            "index": fault.planned.index,
            "at": at,
        }
        async with contextlib.AsyncExitStack() as stack:
            for target in sorted(fault.planned.targets):  # sorted: no lock-order deadlock
                await stack.enter_async_context(self.locks.setdefault(target, asyncio.Lock()))
            t = self.clock.now()
            try:
                async with asyncio.timeout(60):
                    step = fault.start if phase == "start" else fault.end
                    data |= await step(self.ctx)
            except Exception as exc:  # a fault that cannot be applied is recorded, not fatal
                data["error"] = f"{type(exc).__name__}: {exc}"
        data["took_s"] = self.clock.now() - t
        self.history.append(HistoryEvent(t, "fault", data))
        return "error" not in data


async def stop_player(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
