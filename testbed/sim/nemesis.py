"""What the nemesis touches on the sim: the same faults (testbed.nemesis.actions), acting through
a `NemesisContext` whose link and processes are the sim's models.

The link side plays the link verbs (testbed.nemesis.verbs) directly on the link model
(testbed.sim.link): `delay` adds to the RTT and jitter, `timeout` black-holes the link,
`partition` cuts it, `reset` resets transfers, `slow_close` changes nothing for transfers that
keep their connections, `bandwidth` sets the capacity. `slice` and `data_limit` act on the bytes
of a connection, which the sim does not have (its transfers are flows of a size): they are
refused before the run (`SIM_VERBS`, docs/sim.md), never played as a no-op.

The process side kills, pauses, resumes and restarts the modelled instances; the handle of an
instance is its id.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping, Sequence
from typing import Any

from testbed.clock import Clock
from testbed.nemesis.verbs import LinkVerbs
from testbed.sim.cluster import SimInstance
from testbed.sim.link import SimLink

__all__ = ["SIM_LINK", "SIM_VERBS", "SimLinkControl", "SimNemesis", "SimProcesses"]

SIM_VERBS: frozenset[str] = frozenset(
    {"bandwidth", "partition", "delay", "timeout", "reset", "slow_close"}
)
"""The link verbs the sim models; the byte-level ones (`slice`, `data_limit`) are refused."""
SIM_LINK = LinkVerbs("sim", SIM_VERBS, "docs/sim.md")


class SimLinkControl:
    """`nemesis.verbs.LinkControl` of the sim's link: each verb's state kept by key, the link
    model's state recomputed from all of it after every change (`_apply`)."""

    verbs = SIM_LINK

    def __init__(self, link: SimLink, proxies: Sequence[str]) -> None:
        self.link = link
        self._proxies = list(proxies)
        self.cut = False
        """`partition` in force."""
        self.delays: dict[str, tuple[float, float]] = {}
        """By key: (rtt_s, jitter_s)."""
        self.timeouts: dict[str, float] = {}
        self.resets: dict[str, tuple[float, float]] = {}
        """By key: (after_s, probability)."""
        self.slow_closes: dict[str, tuple[float, float]] = {}
        """By key: (delay_s, probability); recorded, changes nothing for transfers."""

    @property
    def configured_bytes_per_s(self) -> float:
        return self.link.capacity

    @property
    def proxies(self) -> Sequence[str]:
        return self._proxies

    async def set_bandwidth(self, real_bytes_per_s: float, /) -> None:
        self.link.set_bandwidth(real_bytes_per_s)

    async def partition(self) -> None:
        """As the live link: every path cut (flows reset, new ones refused)."""
        self.cut = True
        self._apply()

    async def heal(self) -> None:
        self.cut = False
        self._apply()

    async def add_delay(self, key: str, /, *, rtt_s: float, jitter_s: float) -> None:
        self.delays[key] = (rtt_s, jitter_s)
        self._apply()

    async def add_timeout(self, key: str, /, *, timeout_s: float) -> None:
        self.timeouts[key] = timeout_s
        self._apply()

    async def add_reset(self, key: str, /, *, after_s: float, probability: float) -> None:
        self.resets[key] = (after_s, probability)
        self._apply()

    async def add_slow_close(self, key: str, /, *, delay_s: float, probability: float) -> None:
        self.slow_closes[key] = (delay_s, probability)

    async def add_slicer(
        self, key: str, /, *, average_bytes: int, variation_bytes: int, delay_s: float
    ) -> None:
        raise RuntimeError("link verb 'slice' is not modelled on the sim (docs/sim.md)")

    async def add_data_limit(self, key: str, /, *, limit_bytes: int) -> None:
        raise RuntimeError("link verb 'data_limit' is not modelled on the sim (docs/sim.md)")

    async def remove(self, key: str, /) -> None:
        self.delays.pop(key, None)
        self.timeouts.pop(key, None)
        self.resets.pop(key, None)
        self.slow_closes.pop(key, None)
        self._apply()

    def _apply(self) -> None:
        """The link model's state for the verbs in force: delays add up (jitter: the widest),
        the first reset in force picks the transfers, a cut outranks a black hole."""
        link = self.link
        link.extra_rtt = sum(rtt for rtt, _ in self.delays.values())
        link.extra_jitter = max((j for _, j in self.delays.values()), default=0.0)
        if self.resets:
            after, probability = next(iter(self.resets.values()))
            if not link.resetting:
                link.set_resets(probability, after, True)
        elif link.resetting:
            link.set_resets(0.0, 0.0, False)
        if self.cut:
            if link.partition != "disable":
                link.cut("disable", 0.0)
        elif self.timeouts:
            if link.partition != "timeout":
                link.cut("timeout", next(iter(self.timeouts.values())))
        elif link.partition is not None:
            link.heal()


class SimProcesses:
    """`nemesis.fault.Processes` over the modelled instances (handles are instance ids)."""

    def __init__(
        self, instances: dict[str, SimInstance], on_lost: Callable[[SimInstance, str], None]
    ) -> None:
        self.instances = instances
        self.on_lost = on_lost

    async def kill(self, handle: Any, /) -> None:
        inst = self.instances[str(handle)]
        for eng in inst.engines():
            eng.kill()
        self.on_lost(inst, "ServerDisconnectedError")

    async def pause(self, handle: Any, /) -> None:
        for eng in self.instances[str(handle)].engines():
            eng.pause()

    async def resume(self, handle: Any, /) -> None:
        for eng in self.instances[str(handle)].engines():
            eng.resume()

    async def restart(self, handle: Any, /) -> Any:
        inst = self.instances[str(handle)]
        if inst.alive:
            await self.kill(handle)
        for eng in inst.engines():
            eng.restart()
        return handle


class SimNemesis:
    """The `NemesisContext` of a simulated run."""

    def __init__(self, processes: SimProcesses, link: SimLinkControl | None, clock: Clock) -> None:
        self._processes = processes
        self._services: dict[str, Any] = {iid: iid for iid in processes.instances}
        self._link = link
        self._clock = clock

    @property
    def substrate(self) -> SimProcesses:
        return self._processes

    @property
    def services(self) -> MutableMapping[str, Any]:
        return self._services

    @property
    def link(self) -> SimLinkControl | None:
        return self._link

    @property
    def clock(self) -> Clock:
        return self._clock
