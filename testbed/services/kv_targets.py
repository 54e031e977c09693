"""The KV receivers a prefill worker may send to: the deployment's, and no others.

`POST /prefill` and `POST /prefix/send` name a `kv_host:kv_port`, and any local process can call
them; without a check a prefill worker would open connections to, and stream KV bytes at, any
address it is given. So every target must be one the deployment knows: a decode instance's KV
port or a link route in front of one. A target outside the list is a 403, and with no list yet a
428; either way before any connection is opened.

Where the list comes from:
- a plain prefill worker gets it in its ServiceSpec (`kv_targets`): the runner starts decode
  instances and the link first, so it knows every address; a restart keeps the spec.
- a role-switchable PD instance (services/pd.py) starts together with the decode instances, so
  no list exists yet. It accepts one `POST /targets`, once in its life. The router, which holds
  the deployment's instance table, sends it when a prefill answers 428 (router._prefill) and
  retries; a restarted instance (its spec has no list) asks again the same way.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from typing import Any, Final, Protocol

import aiohttp
from aiohttp import web

from testbed.services.spec import InstanceInfo
from testbed.services.validate import BadRequest, json_body

__all__ = [
    "MAX_TARGETS",
    "NO_TARGETS_STATUS",
    "KVTargets",
    "deployment_targets",
    "kv_address",
    "parse_targets",
    "post_targets",
    "targets_handler",
]

MAX_TARGETS: Final = 4096
NO_TARGETS_STATUS: Final = 428
"""Answer of a prefill worker that does not know its deployment's KV receivers yet."""

Target = tuple[str, int]


def _error(cls: type[web.HTTPException], message: str) -> web.HTTPException:
    return cls(text=json.dumps({"error": message}), content_type="application/json")


class KVTargets:
    """The allow-list of one prefill worker."""

    def __init__(self, targets: list[Target] | None) -> None:
        self.allowed: frozenset[Target] | None = (
            None if targets is None else frozenset((str(h), int(p)) for h, p in targets)
        )

    def check(self, target: Target) -> None:
        """Raise the HTTP error that refuses `target`, or return if it may be used."""
        if self.allowed is None:
            raise _error(
                web.HTTPPreconditionRequired,
                "this prefill worker does not know its deployment's KV receivers yet "
                "(POST /targets)",
            )
        if target not in self.allowed:
            raise _error(
                web.HTTPForbidden,
                f"kv target {target[0]}:{target[1]} is not a KV receiver of this deployment",
            )

    def set(self, targets: list[Target]) -> None:
        """The one-time configuration; a 409 once there is a list."""
        if self.allowed is not None:
            raise _error(web.HTTPConflict, "KV targets are already set")
        self.allowed = frozenset(targets)


def parse_targets(value: Any) -> list[Target]:
    """`[[host, port], ...]` from a request body, strictly."""
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_TARGETS:
        raise BadRequest(f"targets must be a list of 1 to {MAX_TARGETS} [host, port] pairs")
    out: list[Target] = []
    for item in value:
        ok = isinstance(item, list) and len(item) == 2
        host, port = (item[0], item[1]) if ok else (None, None)
        if not (isinstance(host, str) and 1 <= len(host.encode()) <= 255):
            raise BadRequest("each target's host must be a non-empty string of at most 255 bytes")
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise BadRequest("each target's port must be an integer in 1..65535")
        out.append((host, port))
    return out


class HasTargets(Protocol):
    targets: KVTargets


def targets_handler(key: web.AppKey[Any]) -> Any:
    """`POST /targets {"targets": [[host, port], ...]}`: the one-time list (see above)."""

    async def handler(request: web.Request) -> web.Response:
        state: HasTargets = request.app[key]
        body = await json_body(request)
        targets = parse_targets(body.get("targets"))
        state.targets.set(targets)
        return web.json_response({"targets": len(targets)})

    return handler


async def post_targets(
    session: aiohttp.ClientSession, base_url: str, targets: Iterable[Target]
) -> bool:
    """Give a prefill worker that answered 428 its deployment's KV receivers (the router's
    side); True if it took them, or already had a list (a 409: someone was first)."""
    body = {"targets": [[h, p] for h, p in sorted(set(targets))]}
    try:
        async with asyncio.timeout(10), session.post(f"{base_url}/targets", json=body) as resp:
            return resp.status in (200, 409)
    except (aiohttp.ClientError, TimeoutError):
        return False


def deployment_targets(instances: Iterable[InstanceInfo]) -> list[Target]:
    """Every KV receiver address in the router's instance table: decode KV ports and the link
    routes in front of them (what the router hands a prefill worker that asks)."""
    out: set[Target] = set()
    for i in instances:
        if i.kv_host is not None and i.kv_port is not None:
            out.add((i.kv_host, i.kv_port))
        if i.kv_link_host is not None and i.kv_link_port is not None:
            out.add((i.kv_link_host, i.kv_link_port))
    return sorted(out)


def kv_address(prefill_cluster: str, decode: InstanceInfo) -> tuple[str, int] | None:
    """Where a prefill in `prefill_cluster` sends a decode instance's KV: through the link when
    the clusters differ, else straight to its KV port; None if the instance has no such address.
    One rule per attempt for our router's dispatch and the router-facing API's prefill half."""
    if prefill_cluster != decode.cluster:
        host, port = decode.kv_link_host, decode.kv_link_port
    else:
        host, port = decode.kv_host, decode.kv_port
    return None if host is None or port is None else (host, port)
