"""Taking a request in, for every router endpoint: the body, the request id, where its tokens
go. Errors come in the OpenAI shape (`{"error": {"message", "type"}}`), the router's on every
endpoint, built on the shared validation (services.validate)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from testbed.kvcache import BLOCK_TOKENS
from testbed.services.router.dispatch import RouterState
from testbed.services.router.errors import ClientGone
from testbed.services.router.steps import TokenSink
from testbed.services.validate import int_field, json_body

__all__ = [
    "STATE",
    "api_error",
    "claim",
    "hash_ids_field",
    "positive_int",
    "read_body",
    "token_sink",
]

STATE = web.AppKey("state", RouterState)


def api_error(
    message: str, status: type[web.HTTPException] = web.HTTPBadRequest
) -> web.HTTPException:
    """An error answer in the OpenAI shape."""
    return status(
        text=json.dumps({"error": {"message": message, "type": "invalid_request_error"}}),
        content_type="application/json",
    )


async def read_body(request: web.Request) -> dict[str, Any]:
    return await json_body(request, error=api_error)


def positive_int(body: dict[str, Any], key: str, limit: int, default: int | None = None) -> int:
    """A field in 1..limit (an integral float counts; no bools, no NaN)."""
    return int_field(body, key, 1, limit, default=default, error=api_error)


def claim(state: RouterState, body: dict[str, Any]) -> str:
    """The request's id: the client's own (unique, 1 to 60 bytes) or a fresh one."""
    rid = body.get("id")
    if rid is None:
        rid = state.next_id()
    elif not isinstance(rid, str) or not 1 <= len(rid.encode()) <= 60:
        raise api_error("id must be a string of 1 to 60 bytes")
    if not state.claim_id(rid):
        raise api_error(f"request id {rid!r} was already used in this run", web.HTTPConflict)
    return rid


def token_sink(resp: web.StreamResponse, encode: Callable[[int], bytes]) -> TokenSink:
    """Write tokens to the client; a client that went away raises ClientGone (see there)."""

    async def on_tokens(n: int) -> None:
        try:
            await resp.write(encode(n))
        except (ConnectionError, aiohttp.ClientConnectionResetError) as exc:
            raise ClientGone(str(exc)) from None

    return on_tokens


def hash_ids_field(body: dict[str, Any], input_tokens: int) -> tuple[int, ...]:
    """The optional `hash_ids` of a Mooncake-style request: one id per 512-token block of the
    prompt (the last may be partial), so at most ceil(input_tokens / 512) signed 64-bit ints.
    Checked before the response starts, so a bad list is a 400, not a failed request."""
    value = body.get("hash_ids")
    if value is None:
        return ()
    limit = -(-input_tokens // BLOCK_TOKENS)
    if not isinstance(value, list) or len(value) > limit:
        raise api_error(
            f"hash_ids must be a list of at most ceil(input_tokens / 512) = {limit} ints"
        )
    if not all(
        isinstance(h, int) and not isinstance(h, bool) and -(2**63) <= h < 2**63 for h in value
    ):
        raise api_error("hash_ids must hold only integers (signed 64-bit)")
    return tuple(value)
