"""What the nemesis touches on the sim: the same faults (testbed.nemesis.actions), acting through
a `NemesisContext` whose link and processes are the sim's models.

The link side speaks the link emulator's API as far as faults use it (`ToxicControl`): toxics
added by name to every proxy (one per decode instance, as live), proxies disabled and enabled.
The set of toxics in force is turned into the link model's state (testbed.sim.link): latency
toxics add to the RTT and jitter, `timeout` black-holes the link, `reset_peer` resets transfers,
`slow_close` changes nothing for transfers that keep their connections, a disabled proxy cuts
the link. Attributes are in the emulator's wall milliseconds, which on the sim's clock
(time_scale 1) are real-world milliseconds.

The process side kills, pauses, resumes and restarts the modelled instances; the handle of an
instance is its id.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping, Sequence
from typing import Any

from testbed.clock import Clock
from testbed.sim.cluster import SimInstance
from testbed.sim.link import SimLink

__all__ = ["SimLinkControl", "SimNemesis", "SimProcesses", "SimToxics"]

KNOWN_TOXICS = ("latency", "timeout", "reset_peer", "slow_close")


class SimToxics:
    """`nemesis.fault.ToxicControl` over the link model."""

    def __init__(self, link: SimLink, proxies: Sequence[str]) -> None:
        self.link = link
        self.proxies = list(proxies)
        self.toxics: dict[str, tuple[str, dict[str, Any], float]] = {}
        """By name (a fault adds the same name to every proxy): type, attributes, toxicity."""
        self.disabled: set[str] = set()

    async def add_toxic(
        self,
        proxy: str,
        type: str,
        /,
        *,
        attributes: dict[str, Any] | None = None,
        stream: str = "downstream",
        name: str | None = None,
        toxicity: float = 1.0,
    ) -> object:
        if type not in KNOWN_TOXICS:
            raise RuntimeError(f"toxic type {type!r} is not modelled on the sim")
        key = f"{name or type}/{stream}"
        self.toxics[key] = (type, dict(attributes or {}), toxicity)
        self._apply()
        return {"name": name}

    async def remove_toxic(self, proxy: str, name: str, /) -> object:
        for key in [k for k in self.toxics if k.rsplit("/", 1)[0] == name]:
            del self.toxics[key]
        self._apply()
        return {}

    async def enable(self, name: str, /) -> object:
        self.disabled.discard(name)
        self._apply()
        return {}

    async def disable(self, name: str, /) -> object:
        self.disabled.add(name)
        self._apply()
        return {}

    def _apply(self) -> None:
        link = self.link
        lat = [a for t, a, _ in self.toxics.values() if t == "latency"]
        link.extra_rtt = sum(float(a.get("latency", 0.0)) for a in lat) / 1e3
        link.extra_jitter = max((float(a.get("jitter", 0.0)) for a in lat), default=0.0) / 1e3
        resets = [(a, tox) for t, a, tox in self.toxics.values() if t == "reset_peer"]
        if resets:
            attrs, tox = resets[0]
            if not link.resetting:
                link.set_resets(tox, float(attrs.get("timeout", 0.0)) / 1e3, True)
        elif link.resetting:
            link.set_resets(0.0, 0.0, False)
        timeouts = [a for t, a, _ in self.toxics.values() if t == "timeout"]
        if self.disabled:
            if link.partition != "disable":
                link.cut("disable", 0.0)
        elif timeouts:
            if link.partition != "timeout":
                link.cut("timeout", float(timeouts[0].get("timeout", 0.0)) / 1e3)
        elif link.partition is not None:
            link.heal()


class SimLinkControl:
    """`nemesis.fault.LinkControl` of the sim's link."""

    def __init__(self, link: SimLink, proxies: Sequence[str]) -> None:
        self.link = link
        self._proxies = list(proxies)
        self._client = SimToxics(link, proxies)

    @property
    def configured_bytes_per_s(self) -> float:
        return self.link.capacity

    @property
    def proxies(self) -> Sequence[str]:
        return self._proxies

    @property
    def client(self) -> SimToxics:
        return self._client

    async def set_bandwidth(self, real_bytes_per_s: float, /) -> None:
        self.link.set_bandwidth(real_bytes_per_s)

    async def partition(self) -> None:
        """As the live LinkSetup: every proxy disabled (flows reset, new ones refused)."""
        for name in self._proxies:
            await self._client.disable(name)

    async def heal(self) -> None:
        for name in self._proxies:
            await self._client.enable(name)

    async def blackhole(self, on: bool, /) -> None:
        """The kernel shaper's packet drop; the sim refuses `shaper: tc`, so nothing to do (the
        `timeout` toxic black-holes the data, as with the emulator)."""


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
