"""The emulator's state and the operations of the Toxiproxy API, independent of HTTP.

One LinkEmulator owns its proxies, the seed and the rate meters; the HTTP layer (api.py) only
decodes requests and renders results or ApiErrors. Mutating calls are serialised by a lock, so
two concurrent creates of the same name cannot both succeed, and each call validates everything
before it changes anything.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from testbed.link.errors import (
    ApiError,
    bad_request,
    missing_field,
    proxy_exists,
    proxy_not_found,
    show,
    too_many,
)
from testbed.link.metrics import RateMeter, render
from testbed.link.proxy import DIRECTIONS, Proxy
from testbed.link.toxics import ToxicWrapper

__all__ = ["MAX_PROXIES", "TOXIPROXY_VERSION", "LinkEmulator"]

# The Toxiproxy API version this emulator speaks (reported by GET /version).
TOXIPROXY_VERSION = "2.12.0"
SAMPLE_INTERVAL = 0.25  # seconds between rate-meter samples
MAX_PROXIES = 1024
"""Proxies one emulator holds at most (Toxiproxy has no cap). A deployment makes one per decode
instance, and a cluster has at most 1000 instances (testbed.config.deployment); each proxy is a
listening socket and a rate meter, so without a cap an API client could use up the process's
descriptors and the deployment's own proxies could not accept (tests/link/test_link_caps.py)."""


def _str_field(body: dict[str, Any], key: str, default: str = "") -> str:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, str):
        raise bad_request(f"field {key!r} must be a string, got {show(value)}")
    return value


def _bool_field(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"field {key!r} must be true or false, got {show(value)}")
    return value


class LinkEmulator:
    """Proxies by name, plus the seed and metrics shared by all of them."""

    def __init__(self, *, seed: int | None = None, listen_netns: str | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        self.seed = seed
        self.listen_netns = listen_netns
        """Proxies listen inside this network namespace (`testbed link serve --listen-netns`,
        the local side of a kernel-shaped link); the API and upstream dials stay here."""
        self.proxies: dict[str, Proxy] = {}
        self.meters: dict[tuple[str, str], RateMeter] = {}
        self.shared: dict[Any, Any] = {}  # state of toxics that span proxies (link groups)
        self._lock = asyncio.Lock()
        self._sampler: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start_sampling(self) -> None:
        if self._sampler is None:
            self._sampler = self.loop.create_task(self._sample_forever())

    async def _sample_forever(self) -> None:
        while True:
            now = self.loop.time()
            for p in list(self.proxies.values()):
                for d in DIRECTIONS:
                    key = (p.name, d)
                    meter = self.meters.get(key)
                    if meter is None:
                        meter = self.meters[key] = RateMeter()
                    meter.sample(now, p.stats[d].sent)
            await asyncio.sleep(SAMPLE_INTERVAL)

    async def close(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
            self._sampler = None
        for p in list(self.proxies.values()):
            p.toxics.reset()
            await p.stop()
        self.proxies.clear()

    # -- proxies -----------------------------------------------------------------------------
    def get_proxy(self, name: str) -> Proxy:
        p = self.proxies.get(name)
        if p is None:
            raise proxy_not_found()
        return p

    def list_json(self) -> dict[str, Any]:
        return {name: p.to_json() for name, p in self.proxies.items()}

    def _new_proxy(self, body: object, where: str = "") -> tuple[Proxy, bool]:
        if not isinstance(body, dict):
            raise bad_request("expected a JSON object for a proxy")
        name = _str_field(body, "name")
        upstream = _str_field(body, "upstream")
        listen = _str_field(body, "listen", "127.0.0.1:0") or "127.0.0.1:0"
        enabled = _bool_field(body, "enabled", True)
        if not name:
            raise missing_field(f"name{where}")
        if not upstream:
            raise missing_field(f"upstream{where}")
        proxy = Proxy(self.loop, name, listen, upstream, self._seed, self.shared, self.listen_netns)
        return proxy, enabled

    def _seed(self) -> int | None:
        return self.seed

    async def create_proxy(self, body: object) -> dict[str, Any]:
        async with self._lock:
            proxy, enabled = self._new_proxy(body)
            if proxy.name in self.proxies:
                raise proxy_exists()
            if len(self.proxies) >= MAX_PROXIES:
                raise too_many("proxies", MAX_PROXIES)
            if enabled:
                await proxy.start()
            self.proxies[proxy.name] = proxy
            return proxy.to_json()

    async def populate(self, body: object) -> list[dict[str, Any]]:
        """Create or replace a list of proxies; same name + listen + upstream is left alone."""
        async with self._lock:
            if not isinstance(body, list):
                raise bad_request("expected a JSON array of proxies")
            wanted: list[tuple[Proxy, bool]] = []
            names: set[str] = set()
            for i, item in enumerate(body):
                proxy, enabled = self._new_proxy(item, f" at proxy {i + 1}")
                if proxy.name in names:
                    raise bad_request(f"duplicate proxy name {proxy.name!r}")
                names.add(proxy.name)
                wanted.append((proxy, enabled))
            if len(names | self.proxies.keys()) > MAX_PROXIES:
                raise too_many("proxies", MAX_PROXIES)
            result: list[Proxy] = []
            for proxy, enabled in wanted:
                old = self.proxies.get(proxy.name)
                if (
                    old is not None
                    and old.upstream == proxy.upstream
                    and (old.listen == proxy.listen or proxy.listen.endswith(":0"))
                ):
                    result.append(old)
                    continue
                if old is not None:
                    old.toxics.reset()
                    await old.stop()
                    del self.proxies[old.name]
                if enabled:
                    await proxy.start()
                self.proxies[proxy.name] = proxy
                result.append(proxy)
            return [p.to_json() for p in result]

    async def update_proxy(self, name: str, body: object) -> dict[str, Any]:
        async with self._lock:
            proxy = self.get_proxy(name)
            if not isinstance(body, dict):
                raise bad_request("expected a JSON object for a proxy")
            listen = _str_field(body, "listen", proxy.listen) or proxy.listen
            upstream = _str_field(body, "upstream", proxy.upstream) or proxy.upstream
            enabled = _bool_field(body, "enabled", proxy.enabled)
            await proxy.update(listen, upstream, enabled)
            return proxy.to_json()

    async def delete_proxy(self, name: str) -> None:
        async with self._lock:
            proxy = self.get_proxy(name)
            del self.proxies[name]
            proxy.toxics.reset()
            await proxy.stop()
            for d in DIRECTIONS:
                self.meters.pop((name, d), None)

    async def reset(self, body: object) -> None:
        """Enable every proxy and remove every toxic; a body {"seed": n} also re-seeds."""
        async with self._lock:
            if isinstance(body, dict) and "seed" in body:
                seed = body["seed"]
                if seed is not None and (
                    isinstance(seed, bool) or not isinstance(seed, int) or abs(seed) >= 2**63
                ):
                    raise bad_request(
                        f"field 'seed' must be a 64-bit integer or null, got {show(seed)}"
                    )
                self.seed = seed
                for p in self.proxies.values():
                    p.reset_indices()
            for p in self.proxies.values():
                with contextlib.suppress(ApiError):
                    await p.start()  # as Toxiproxy: a proxy that cannot re-listen stays disabled
                p.toxics.reset()

    # -- toxics ------------------------------------------------------------------------------
    def toxics_json(self, proxy: str) -> list[dict[str, Any]]:
        return self.get_proxy(proxy).toxics.to_json()

    def get_toxic(self, proxy: str, toxic: str) -> ToxicWrapper:
        return self.get_proxy(proxy).toxics.get(toxic)

    async def add_toxic(self, proxy: str, body: object) -> dict[str, Any]:
        async with self._lock:
            return (await self.get_proxy(proxy).toxics.add(body)).to_json()

    async def update_toxic(self, proxy: str, toxic: str, body: object) -> dict[str, Any]:
        async with self._lock:
            return (await self.get_proxy(proxy).toxics.update(toxic, body)).to_json()

    async def remove_toxic(self, proxy: str, toxic: str) -> None:
        async with self._lock:
            self.get_proxy(proxy).toxics.remove(toxic)

    def metrics_text(self) -> str:
        return render(self.proxies.values(), self.meters)
