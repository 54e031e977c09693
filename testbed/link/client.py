"""Async client for the link emulator (and any Toxiproxy 2.x server), used by the testbed.

Every call has a timeout; failures raise LinkApiError carrying Toxiproxy's status and message,
so callers can tell "no such proxy" (404) from "already exists" (409) from bad input (400).
Rates are bytes/s here (SI inside the testbed) and converted to the API's KB/s on the way out.

    async with LinkClient("http://127.0.0.1:8474") as link:
        p = await link.create_proxy("xdc", upstream="127.0.0.1:9000")
        await link.set_link_bandwidth("xdc", 12.5e6)          # 100 Mbit/s shared, both ways
        await link.add_toxic("xdc", "latency", attributes={"latency": 20, "jitter": 2},
                             stream="both")
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import aiohttp

__all__ = ["DEFAULT_TIMEOUT", "LinkApiError", "LinkClient"]

DEFAULT_TIMEOUT = 10.0  # seconds for any one API call
LINK_TOXIC = "link_bandwidth"


class LinkApiError(Exception):
    """The API answered with an error (or not at all: status 0)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"link API error {status}: {message}")
        self.status = status
        self.message = message


class LinkClient:
    """Thin async wrapper over the Toxiproxy HTTP API plus the emulator's extensions."""

    def __init__(self, url: str = "http://127.0.0.1:8474", *, timeout: float = DEFAULT_TIMEOUT):
        self.url = url.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> LinkClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        return self._session

    async def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": "application/json"} if data is not None else {}
        try:
            async with self._http().request(
                method, self.url + path, data=data, headers=headers
            ) as resp:
                text = await resp.text()
                if resp.status >= 400:
                    try:
                        message = json.loads(text).get("error", text)
                    except (ValueError, AttributeError):
                        message = text.strip()
                    raise LinkApiError(resp.status, message)
                if resp.status == 204 or not text.strip():
                    return None
                if resp.content_type == "application/json":
                    return json.loads(text)
                return text
        except (aiohttp.ClientError, TimeoutError) as exc:
            detail = str(exc) or type(exc).__name__
            raise LinkApiError(0, f"{method} {self.url}{path}: {detail}") from exc

    # -- server ----------------------------------------------------------------------------
    async def version(self) -> str:
        data = await self._call("GET", "/version")
        return str(data["version"]) if isinstance(data, dict) else str(data).strip()

    async def reset(self, *, seed: int | None = None) -> None:
        """Enable all proxies and remove all toxics; with `seed`, re-seed (extension)."""
        await self._call("POST", "/reset", {"seed": seed} if seed is not None else None)

    async def metrics(self) -> str:
        return str(await self._call("GET", "/metrics"))

    # -- proxies ---------------------------------------------------------------------------
    async def proxies(self) -> dict[str, Any]:
        return dict(await self._call("GET", "/proxies"))

    async def create_proxy(
        self, name: str, upstream: str, listen: str = "127.0.0.1:0", *, enabled: bool = True
    ) -> dict[str, Any]:
        body = {"name": name, "upstream": upstream, "listen": listen, "enabled": enabled}
        return dict(await self._call("POST", "/proxies", body))

    async def populate(self, proxies: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        return list((await self._call("POST", "/populate", list(proxies)))["proxies"])

    async def get_proxy(self, name: str) -> dict[str, Any]:
        return dict(await self._call("GET", f"/proxies/{name}"))

    async def update_proxy(self, name: str, **fields: Any) -> dict[str, Any]:
        """PATCH listen / upstream / enabled."""
        return dict(await self._call("PATCH", f"/proxies/{name}", fields))

    async def enable(self, name: str) -> dict[str, Any]:
        return await self.update_proxy(name, enabled=True)

    async def disable(self, name: str) -> dict[str, Any]:
        return await self.update_proxy(name, enabled=False)

    async def delete_proxy(self, name: str) -> None:
        await self._call("DELETE", f"/proxies/{name}")

    # -- toxics ----------------------------------------------------------------------------
    async def toxics(self, proxy: str) -> list[dict[str, Any]]:
        return list(await self._call("GET", f"/proxies/{proxy}/toxics"))

    async def get_toxic(self, proxy: str, name: str) -> dict[str, Any]:
        return dict(await self._call("GET", f"/proxies/{proxy}/toxics/{name}"))

    async def add_toxic(
        self,
        proxy: str,
        type: str,
        *,
        attributes: dict[str, Any] | None = None,
        stream: str = "downstream",
        name: str | None = None,
        toxicity: float = 1.0,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": type,
            "stream": stream,
            "toxicity": toxicity,
            "attributes": attributes or {},
        }
        if name:
            body["name"] = name
        return dict(await self._call("POST", f"/proxies/{proxy}/toxics", body))

    async def update_toxic(
        self,
        proxy: str,
        name: str,
        *,
        attributes: dict[str, Any] | None = None,
        toxicity: float | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"attributes": attributes or {}}
        if toxicity is not None:
            body["toxicity"] = toxicity
        return dict(await self._call("PATCH", f"/proxies/{proxy}/toxics/{name}", body))

    async def remove_toxic(self, proxy: str, name: str) -> None:
        await self._call("DELETE", f"/proxies/{proxy}/toxics/{name}")

    # -- extensions: the shared link cap ---------------------------------------------------
    async def _upsert_link(
        self, proxy: str, attributes: dict[str, Any], stream: str, name: str
    ) -> dict[str, Any]:
        try:
            return await self.update_toxic(proxy, name, attributes=attributes)
        except LinkApiError as exc:
            if exc.status != 404:
                raise
        return await self.add_toxic(
            proxy, LINK_TOXIC, attributes=attributes, stream=stream, name=name
        )

    async def set_link_bandwidth(
        self, proxy: str, rate: float, *, stream: str = "both", name: str = LINK_TOXIC
    ) -> dict[str, Any]:
        """Cap all connections of `proxy` together at `rate` bytes/s (creates or updates)."""
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        attrs = {"rate": rate / 1000.0, "schedule": [], "schedule_file": "", "period": 0}
        return await self._upsert_link(proxy, attrs, stream, name)

    async def set_bandwidth_schedule(
        self,
        proxy: str,
        steps: Sequence[tuple[float, float]],
        *,
        period: float = 0.0,
        stream: str = "both",
        name: str = LINK_TOXIC,
    ) -> dict[str, Any]:
        """Play `steps` of (seconds from now, bytes/s) on the shared cap, repeating if period."""
        if not steps:
            raise ValueError("a schedule needs at least one step")
        sched = [[float(t), float(r) / 1000.0] for t, r in sorted(steps)]
        attrs = {"rate": 0, "schedule": sched, "schedule_file": "", "period": period}
        if sched[0][0] > 0:
            attrs["rate"] = sched[0][1]
        return await self._upsert_link(proxy, attrs, stream, name)
