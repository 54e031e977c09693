"""The router's calls to its prefill and decode workers, over HTTP.

`Workers` is what the dispatch logic (services.router.dispatch) needs from the instances; a
failure to reach one becomes an `AttemptError` naming it dead, so the dispatcher only decides
what to retry. Tests of the retry logic hand the router a fake with the same methods.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, Iterable
from typing import Any, Protocol

import aiohttp

from testbed.dispatch.core import Failure
from testbed.services import cache_pull
from testbed.services.kv_targets import NO_TARGETS_STATUS, deployment_targets, post_targets
from testbed.services.router.errors import AttemptError
from testbed.services.spec import InstanceInfo

__all__ = ["HttpWorkers", "Workers"]

HEALTH_TIMEOUT_S = 1.0
STATS_TIMEOUT_S = 1.0
FIRST_TOKEN_TIMEOUT_S = 10.0
CANCEL_TIMEOUT_S = 5.0
ROLE_ATTEMPTS = 50
"""POST /role tries while the instance still reports work (0.1 s wall apart)."""


class Workers(Protocol):
    async def prefill(
        self, inst: InstanceInfo, body: dict[str, Any], instances: Iterable[InstanceInfo]
    ) -> tuple[int, dict[str, Any]]:
        """`POST /prefill`: the status and answer (a worker that does not know its KV targets
        yet is handed the deployment's, from `instances`, and asked again)."""
        ...

    def decode(
        self, inst: InstanceInfo, body: dict[str, Any]
    ) -> AsyncGenerator[dict[str, Any], None]:
        """`POST /decode`: the lines of the NDJSON answer, as they come."""
        ...

    async def first_token(self, inst: InstanceInfo, wire_id: str, token: Any) -> bool:
        """Hand the prefill's first token to the decode instance; False if it was not taken."""
        ...

    async def cancel_decode(self, inst: InstanceInfo, wire_id: str) -> None: ...

    async def pull_prefix(self, **kw: Any) -> cache_pull.PullResult: ...

    async def stats(self, inst: InstanceInfo) -> dict[str, Any] | None: ...

    async def healthy(self, inst: InstanceInfo) -> bool: ...

    async def post_role(self, base_url: str, role: str, wait_s: float) -> dict[str, Any] | None:
        """`POST /role` on a PD instance; None if it never accepts."""
        ...


class HttpWorkers:
    """`Workers` over one aiohttp session (its total timeout is the request timeout)."""

    def __init__(self, session: aiohttp.ClientSession, request_timeout_s: float) -> None:
        self.session = session
        self.request_timeout_s = request_timeout_s

    async def prefill(
        self, inst: InstanceInfo, body: dict[str, Any], instances: Iterable[InstanceInfo]
    ) -> tuple[int, dict[str, Any]]:
        session = self.session

        async def post() -> tuple[int, dict[str, Any]]:
            async with session.post(f"{inst.url}/prefill", json=body) as resp:
                return resp.status, await resp.json(content_type=None)

        try:
            async with asyncio.timeout(self.request_timeout_s):
                status, doc = await post()
                # A worker that does not know the deployment's KV receivers yet (a PD instance,
                # a restarted one): hand it the instance table's, then ask again.
                if status == NO_TARGETS_STATUS and await post_targets(
                    session, inst.url, deployment_targets(instances)
                ):
                    status, doc = await post()
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise AttemptError.of(
                Failure.prefill_unreachable(inst.id, type(exc).__name__)
            ) from None
        return status, doc

    async def decode(
        self, inst: InstanceInfo, body: dict[str, Any]
    ) -> AsyncGenerator[dict[str, Any], None]:
        try:
            async with self.session.post(f"{inst.url}/decode", json=body) as resp:
                if resp.status != 200:
                    raise AttemptError(f"decode on {inst.id}: HTTP {resp.status}")
                async for line in resp.content:
                    if line.strip():
                        yield json.loads(line)
        except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
            raise AttemptError.of(Failure.decode_lost(inst.id, type(exc).__name__)) from None

    async def first_token(self, inst: InstanceInfo, wire_id: str, token: Any) -> bool:
        try:
            async with asyncio.timeout(FIRST_TOKEN_TIMEOUT_S):
                url = f"{inst.url}/decode/{wire_id}/first_token"
                async with self.session.post(url, json={"first_token_id": token}) as resp:
                    return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def cancel_decode(self, inst: InstanceInfo, wire_id: str) -> None:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with asyncio.timeout(CANCEL_TIMEOUT_S):
                await self.session.delete(f"{inst.url}/decode/{wire_id}")

    async def pull_prefix(self, **kw: Any) -> cache_pull.PullResult:
        return await cache_pull.pull_prefix(self.session, **kw)

    async def stats(self, inst: InstanceInfo) -> dict[str, Any] | None:
        try:
            async with asyncio.timeout(STATS_TIMEOUT_S):
                async with self.session.get(f"{inst.url}/stats") as resp:
                    doc: dict[str, Any] = await resp.json()
                    return doc
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    async def healthy(self, inst: InstanceInfo) -> bool:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with asyncio.timeout(HEALTH_TIMEOUT_S):
                async with self.session.get(f"{inst.url}/health") as resp:
                    return resp.status == 200
        return False

    async def post_role(self, base_url: str, role: str, wait_s: float) -> dict[str, Any] | None:
        """Retries while the instance answers 409 (a request that raced the drain)."""
        for _ in range(ROLE_ATTEMPTS):  # 50 x 0.1 s wall at most, besides the switch itself
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                async with asyncio.timeout(wait_s + 10):
                    async with self.session.post(f"{base_url}/role", json={"role": role}) as resp:
                        if resp.status == 200:
                            doc: dict[str, Any] = await resp.json()
                            return doc
                        if resp.status != 409:
                            return None
            await asyncio.sleep(0.1)
        return None
