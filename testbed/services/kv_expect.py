"""The decode side's half of a KV handshake: register the request, then say so.

A decode instance's KV receiver accepts frames only for requests it expects (transfer/
reassembly.py), so a request must be registered before its sender starts. The router opens
`POST /decode` (or `POST /prefix/receive` for a cache pull) first; the handler registers the
request's wire id with its receiver and answers the stream's first NDJSON line, `EXPECTING`;
only when the router has read that line does it ask the prefill to send. The wire id is the
request's capability: an unguessable token the router hands only to this decode and to the
prefill it picked (transfer/capability.py); `label`, the client-visible id, names it in logs.
"""

from __future__ import annotations

import json
from typing import Any, Final

from aiohttp import web

from testbed.dispatch.rules import REGISTER_TIMEOUT_S
from testbed.services.validate import str_field
from testbed.transfer.reassembly import ReceiverFull
from testbed.transfer.receiver import KVReceiver

__all__ = ["EXPECTING", "EXPECT_GRACE_S", "REGISTER_TIMEOUT_S", "expect_kv", "label_field"]

EXPECTING: Final = b'{"expecting":true}\n'
"""The first line of a /decode or /prefix/receive stream: the receiver now accepts its KV."""

EXPECT_GRACE_S: Final = 30.0
"""Wall seconds past kv_timeout_s after which the receiver frees a request its handler never
discarded (the handler's own timeout comes first; this is the backstop)."""


def label_field(body: dict[str, Any]) -> str | None:
    """The optional client-visible request id the router sends along for logs."""
    return str_field(body, "request", 64) if body.get("request") is not None else None


def _error(cls: type[web.HTTPException], message: str) -> web.HTTPException:
    return cls(text=json.dumps({"error": message}), content_type="application/json")


def expect_kv(
    receiver: KVReceiver,
    wire_id: str,
    *,
    total_bytes: int | None,
    timeout_s: float,
    label: str | None,
) -> None:
    """Register `wire_id` with the receiver; a 409 for an id already known, a 503 when the
    receiver tracks as many requests as it may."""
    try:
        receiver.expect(
            wire_id, total_bytes=total_bytes, ttl=timeout_s + EXPECT_GRACE_S, label=label
        )
    except ValueError as exc:
        raise _error(web.HTTPConflict, str(exc)) from None
    except ReceiverFull as exc:
        raise _error(web.HTTPServiceUnavailable, str(exc)) from None
