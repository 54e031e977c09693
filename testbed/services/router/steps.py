"""The two halves of one dispatch attempt (services.router.dispatch): the prefill call and the
decode stream, each reading its answer into the request's record.

A failure that another instance might not have is an `AttemptError` (the dispatcher retries); a
decode that streamed the wrong number of tokens is a `RequestError` (the request fails).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from testbed.dispatch.core import Failure
from testbed.metrics.records import RequestRecord
from testbed.services.router.engines import EngineRequests
from testbed.services.router.errors import AttemptError, RequestError
from testbed.services.router.workers import Workers
from testbed.services.spec import InstanceInfo

__all__ = ["TokenSink", "run_prefill", "stream_decode"]

TokenSink = Callable[[int], Awaitable[None]]

TIMES = ("prefill_start", "prefill_end", "transfer_start", "transfer_end")


async def run_prefill(
    workers: Workers,
    engine: EngineRequests,
    instances: Mapping[str, InstanceInfo],
    inst: InstanceInfo,
    rec: RequestRecord,
    wire_id: str,
    tokens: int,
    kv: tuple[Any, Any],
    kv_tokens: int,
) -> None:
    """Prefill `tokens` on `inst`, its KV (`kv_tokens` of it) sent to the `kv` address; when
    the engine says so, hand the first token it computed to the request's decode instance."""
    body: dict[str, Any] = {
        "id": wire_id,
        "uncached_tokens": tokens,
        "kv_host": kv[0],
        "kv_port": kv[1],
        **engine.prefill_fields(rec, tokens, kv_tokens),
    }
    status, doc = await workers.prefill(inst, body, instances.values())
    for key in TIMES:
        if key in doc:
            setattr(rec, key, doc[key])
    rec.kv_wire_bytes_sent = int(doc.get("kv_wire_bytes_sent", 0))
    if status != 200 or "error" in doc:
        raise AttemptError.of(
            Failure.prefill_failed(
                inst.id, doc.get("error", status), rec.cross_dc, rec.decode_instance
            )
        )
    if engine.relays_first_token:  # the control path: prefill -> router -> decode
        assert rec.decode_instance is not None
        target = instances[rec.decode_instance]
        if not await workers.first_token(target, wire_id, doc.get("first_token_id")):
            raise AttemptError(
                f"decode on {target.id}: first token not delivered", suspect=target.id
            )


async def stream_decode(
    workers: Workers,
    inst: InstanceInfo,
    rec: RequestRecord,
    wire_id: str,
    on_tokens: TokenSink,
    registered: asyncio.Event,
) -> None:
    """Stream this attempt's tokens; those the client already has are not sent again.

    `registered` is set at the stream's first line: the decode's KV receiver now expects
    `wire_id` (services/kv_expect.py), so the prefill may start sending."""
    body = {
        "id": wire_id,
        "request": rec.id,
        "output_tokens": rec.output_tokens,
        "expected_wire_bytes": rec.kv_wire_bytes_expected,
    }
    already = rec.tokens_out
    generated = 0
    verified = False  # this attempt's KV was verified before its first token ("admitted")
    async with contextlib.aclosing(workers.decode(inst, body)) as lines:
        async for doc in lines:
            if doc.get("expecting"):
                registered.set()
            elif doc.get("admitted"):
                verified = bool(doc.get("kv_verified"))
                rec.kv_verified = verified
            elif "tokens" in doc and "done" not in doc:
                if not verified:  # tokens from KV not known verified: taint the record
                    rec.kv_verified = False
                generated += int(doc["tokens"])
                if generated > rec.tokens_out:
                    new = generated - rec.tokens_out
                    if isinstance(doc.get("ids"), list):  # engine: torch: the ids so far
                        rec.output_ids = [*(rec.output_ids or []), *doc["ids"][-new:]]
                    rec.tokens_out = generated
                    await on_tokens(new)
            elif doc.get("done"):
                if rec.first_token is None or already == 0:
                    rec.first_token = doc["first_token"]
                rec.last_token = doc["last_token"]
                rec.kv_wire_bytes_received = int(doc["kv_wire_bytes"])
                rec.kv_verified = bool(doc["kv_verified"]) and verified
                if "token_ids" in doc:  # engine: torch: what the model generated
                    rec.output_ids = [int(t) for t in doc["token_ids"]]
                if generated != doc["tokens"] or rec.tokens_out != rec.output_tokens:
                    raise RequestError(
                        f"decode on {inst.id}: streamed {generated} tokens of {doc['tokens']}"
                    )
                return
            elif "error" in doc:
                raise AttemptError(f"decode on {inst.id}: {doc['error']}")
    raise AttemptError(f"decode on {inst.id}: stream ended without a result", dead=inst.id)
